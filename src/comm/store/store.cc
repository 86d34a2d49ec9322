#include "chorus/comm/store/store.h"

#include <sstream>

namespace chorus::comm {
namespace {

// Enough keys to recognise the pattern; a wait on thousands of keys must not make a huge message.
constexpr std::size_t kKeysShown = 8;
// Beyond this a deadline is as good as never, and adding it to now() could overflow.
constexpr std::chrono::hours kForever{24 * 365 * 100};

}  // namespace

Bytes toBytes(const std::string& text) { return Bytes(text.begin(), text.end()); }

std::string toString(const Bytes& bytes) { return std::string(bytes.begin(), bytes.end()); }

std::string describeKeys(const std::vector<std::string>& keys) {
  std::ostringstream out;
  for (std::size_t i = 0; i < keys.size() && i < kKeysShown; ++i) {
    out << (i ? ", " : "") << "'" << keys[i] << "'";
  }
  if (keys.size() > kKeysShown) out << " and " << keys.size() - kKeysShown << " more";
  return out.str();
}

Deadline deadlineFor(std::chrono::milliseconds timeout) {
  if (timeout >= kForever) return Deadline::never();
  // Already expired. Not Deadline::after(timeout): a large negative timeout (one a store client
  // may send) overflows the clock's nanoseconds, undefined behaviour (fuzz/store_server_fuzzer.cc).
  if (timeout <= std::chrono::milliseconds::zero()) return Deadline::after(Millis::zero());
  return Deadline::after(timeout);
}

}  // namespace chorus::comm
