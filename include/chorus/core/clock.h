// Clocks and deadlines.
//
// Invariant 2 (docs/architecture.md, "Invariants"): nothing blocks without a deadline. A Deadline
// is a value that every blocking call takes (or derives from an options struct's timeout), so a
// chain of calls shares one budget instead of each restarting its own timeout.
#pragma once

#include <chrono>

namespace chorus {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

// A point in time after which a blocking operation gives up. Value type; thread-safe to copy.
class Deadline {
 public:
  // A deadline `timeout` from now. A negative or zero timeout is already expired.
  static Deadline after(Millis timeout) { return Deadline(Clock::now() + timeout); }
  // A deadline that never expires; only for tests and explicit user requests.
  static Deadline never() { return Deadline(Clock::time_point::max()); }

  Clock::time_point when() const { return when_; }
  bool expired() const { return Clock::now() >= when_; }
  // Time left, never negative.
  Millis remaining() const {
    if (when_ == Clock::time_point::max()) return Millis::max();
    auto left = std::chrono::duration_cast<Millis>(when_ - Clock::now());
    return left.count() > 0 ? left : Millis(0);
  }

 private:
  explicit Deadline(Clock::time_point when) : when_(when) {}
  Clock::time_point when_;
};

// Measures elapsed wall time from construction or the last reset(). Not thread-safe.
class Stopwatch {
 public:
  Stopwatch() : start_(Clock::now()) {}
  void reset() { start_ = Clock::now(); }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  Millis millis() const { return std::chrono::duration_cast<Millis>(Clock::now() - start_); }

 private:
  Clock::time_point start_;
};

}  // namespace chorus
