#include "chorus/core/logging.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>

namespace chorus {

LogLevel parseLogLevel(const std::string& text) {
  if (text == "debug") return LogLevel::kDebug;
  if (text == "info") return LogLevel::kInfo;
  if (text == "warn") return LogLevel::kWarn;
  if (text == "error") return LogLevel::kError;
  if (text == "off") return LogLevel::kOff;
  CHORUS_THROW(ConfigError, "invalid log level '", text,
               "': expected debug, info, warn, error or off");
}

Logger& Logger::instance() {
  static Logger logger;
  return logger;
}

void Logger::write(LogLevel level, const std::string& message) const {
  static const char* const kTags[] = {"D", "I", "W", "E", "-"};
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const int millis = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm local{};
  localtime_r(&seconds, &local);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%H:%M:%S", &local);
  std::string line = detail::concat(kTags[static_cast<int>(level)], " ", stamp, ".", millis / 100,
                                    (millis / 10) % 10, millis % 10, " ");
  if (!prefix_.empty()) line += "[" + prefix_ + "] ";
  line += message;
  line += '\n';
  // One write per line keeps lines whole when several threads or processes share stderr.
  const ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace chorus
