// Minimal leveled logging to stderr.
//
// One Logger per process is the single process-wide object chorus keeps (documented in
// docs/architecture.md): its level and prefix are set once at start-up (chorus::init or the CLI)
// and only read afterwards. Writing is thread-safe: each message is emitted as one line with one
// write, so lines of different threads never interleave.
#pragma once

#include <atomic>
#include <string>

#include "chorus/core/error.h"

namespace chorus {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

// Parses "debug", "info", "warn", "error", "off"; throws ConfigError otherwise.
LogLevel parseLogLevel(const std::string& text);

class Logger {
 public:
  // The process's logger. Default level: kInfo; default prefix: none.
  static Logger& instance();

  void setLevel(LogLevel level) { level_.store(level); }
  LogLevel level() const { return level_.load(); }
  bool enabled(LogLevel level) const { return level >= level_.load(); }
  // A tag put in front of every line, e.g. "rank 3"; set once at start-up, before threads start.
  void setPrefix(std::string prefix) { prefix_ = std::move(prefix); }

  void write(LogLevel level, const std::string& message) const;

 private:
  Logger() = default;
  std::atomic<LogLevel> level_{LogLevel::kInfo};
  std::string prefix_;
};

template <typename... Args>
void logAt(LogLevel level, Args&&... args) {
  Logger& logger = Logger::instance();
  if (logger.enabled(level)) logger.write(level, detail::concat(std::forward<Args>(args)...));
}
template <typename... Args>
void logDebug(Args&&... args) {
  logAt(LogLevel::kDebug, std::forward<Args>(args)...);
}
template <typename... Args>
void logInfo(Args&&... args) {
  logAt(LogLevel::kInfo, std::forward<Args>(args)...);
}
template <typename... Args>
void logWarn(Args&&... args) {
  logAt(LogLevel::kWarn, std::forward<Args>(args)...);
}
template <typename... Args>
void logError(Args&&... args) {
  logAt(LogLevel::kError, std::forward<Args>(args)...);
}

}  // namespace chorus
