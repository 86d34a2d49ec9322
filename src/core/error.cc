#include "chorus/core/error.h"

namespace chorus {

Error::Error(std::string message, const char* file, int line)
    : std::runtime_error(detail::concat(message, " [", file, ":", line, "]")),
      message_(std::move(message)),
      file_(file),
      line_(line) {}

TimeoutError::TimeoutError(std::string message, const char* file, int line, std::string operation,
                           long long sequence, std::vector<int> missing_ranks)
    : CommError(std::move(message), file, line),
      operation_(std::move(operation)),
      sequence_(sequence),
      missing_ranks_(std::move(missing_ranks)) {}

PeerFailure::PeerFailure(std::string message, const char* file, int line, std::vector<int> ranks)
    : CommError(std::move(message), file, line), ranks_(std::move(ranks)) {}

std::string joinInts(const std::vector<int>& values, const char* separator) {
  std::ostringstream out;
  for (size_t i = 0; i < values.size(); ++i) out << (i ? separator : "") << values[i];
  return out.str();
}

}  // namespace chorus
