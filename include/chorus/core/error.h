// Typed errors for every chorus layer.
//
// Every failure the library reports is an exception derived from chorus::Error, thrown through
// CHORUS_THROW so it records the file and line where it was raised. Callers can act on the type
// (elastic recovery catches PeerFailure, the CLI maps each type to an exit code); nothing in the
// library prints-and-exits. The policy is documented in docs/errors.md.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace chorus {

// Base of all chorus errors. Immutable value; safe to copy and to rethrow across threads.
class Error : public std::runtime_error {
 public:
  Error(std::string message, const char* file, int line);

  // The human-readable message, without the source location.
  const std::string& message() const { return message_; }
  const char* file() const { return file_; }
  int line() const { return line_; }
  // The error's type name, e.g. "ConfigError"; used by the CLI's one-line report.
  virtual const char* kind() const { return "Error"; }

 private:
  std::string message_;
  const char* file_;
  int line_;
};

#define CHORUS_DECLARE_ERROR(Name, Base)                \
  class Name : public Base {                            \
   public:                                              \
    using Base::Base;                                   \
    const char* kind() const override { return #Name; } \
  }

// A configuration, device spec or command line that cannot be used as given.
CHORUS_DECLARE_ERROR(ConfigError, Error);
// A device that cannot be found, opened or measured.
CHORUS_DECLARE_ERROR(DeviceError, Error);
// A memory budget (real or emulated) exceeded.
CHORUS_DECLARE_ERROR(OutOfMemoryError, DeviceError);
// A failure of communication: store, transport or collective.
CHORUS_DECLARE_ERROR(CommError, Error);
// A peer presented the wrong job secret, or we did.
CHORUS_DECLARE_ERROR(AuthError, CommError);
// A peer does not speak our protocol (wrong magic, version or message).
CHORUS_DECLARE_ERROR(ProtocolError, CommError);
// A checkpoint that cannot be written, read or verified.
CHORUS_DECLARE_ERROR(CheckpointError, Error);
// Starting or supervising worker processes failed.
CHORUS_DECLARE_ERROR(LaunchError, Error);

#undef CHORUS_DECLARE_ERROR

// An operation that did not complete before its deadline. Names the operation, its sequence
// number within its group, and the ranks that had not arrived (empty when unknown).
class TimeoutError : public CommError {
 public:
  TimeoutError(std::string message, const char* file, int line, std::string operation = "",
               long long sequence = -1, std::vector<int> missing_ranks = {});
  const char* kind() const override { return "TimeoutError"; }
  const std::string& operation() const { return operation_; }
  long long sequence() const { return sequence_; }
  const std::vector<int>& missingRanks() const { return missing_ranks_; }

 private:
  std::string operation_;
  long long sequence_;
  std::vector<int> missing_ranks_;
};

// A peer died or dropped its connection. `ranks` names the peers believed lost (may be empty).
class PeerFailure : public CommError {
 public:
  PeerFailure(std::string message, const char* file, int line, std::vector<int> ranks = {});
  const char* kind() const override { return "PeerFailure"; }
  const std::vector<int>& ranks() const { return ranks_; }

 private:
  std::vector<int> ranks_;
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}
}  // namespace detail

// Formats a list of ints as "1, 3, 4".
std::string joinInts(const std::vector<int>& values, const char* separator = ", ");

}  // namespace chorus

// Throws `Type` with a message built from the remaining arguments (streamed), plus file and line.
#define CHORUS_THROW(Type, ...) \
  throw Type(::chorus::detail::concat(__VA_ARGS__), __FILE__, __LINE__)

// Throws ConfigError unless `cond` holds.
#define CHORUS_CHECK_CONFIG(cond, ...)                             \
  do {                                                             \
    if (!(cond)) CHORUS_THROW(::chorus::ConfigError, __VA_ARGS__); \
  } while (0)
