// A clock that a test moves, for SpeedEmulator tests with exact expectations: the test says what
// the worker did (computed on its core, waited for a core, was blocked on a peer) and the
// emulator's sleeps advance the clock by what they asked plus a fixed lateness.
#pragma once

#include <atomic>
#include <cstdint>

#include "chorus/device/emulation_clock.h"

namespace chorus::device::testing {

// One simulated thread. Thread-safe (atomics), as EmulationClock requires.
class FakeEmulationClock final : public EmulationClock {
 public:
  // `late_ns`: how late every sleep wakes (a real sleep overshoots by tens of microseconds).
  // Default: 0.
  explicit FakeEmulationClock(std::int64_t late_ns = 0) : late_ns_(late_ns) {}

  std::int64_t nowNanos() override { return now_; }
  std::int64_t threadCpuNanos() override { return cpu_; }
  std::int64_t threadRunDelayNanos() override { return delay_; }
  void sleepFor(std::int64_t nanos) override {
    now_ += nanos + late_ns_;
    slept_ += nanos + late_ns_;
    ++sleeps_;
  }

  // The worker computes on its core for `seconds`: wall and CPU time pass.
  void compute(double seconds) {
    now_ += nanos(seconds);
    cpu_ += nanos(seconds);
  }
  // The worker is runnable but another has the core: wall time and run delay pass.
  void waitForCore(double seconds) {
    now_ += nanos(seconds);
    delay_ += nanos(seconds);
  }
  // The worker is blocked (on a peer, or between steps): only wall time passes.
  void block(double seconds) { now_ += nanos(seconds); }

  double seconds() const { return static_cast<double>(now_) * 1e-9; }
  double sleptSeconds() const { return static_cast<double>(slept_) * 1e-9; }
  int sleeps() const { return sleeps_; }

 private:
  static std::int64_t nanos(double seconds) { return static_cast<std::int64_t>(seconds * 1e9); }

  const std::int64_t late_ns_;
  std::atomic<std::int64_t> now_{1000000000};  // not 0: a zero time stands out in a bug
  std::atomic<std::int64_t> cpu_{0};
  std::atomic<std::int64_t> delay_{0};
  std::atomic<std::int64_t> slept_{0};
  std::atomic<int> sleeps_{0};
};

}  // namespace chorus::device::testing
