// The clocks and the sleep a SpeedEmulator pads with, behind one interface (as leveldb's Env puts
// the file system and the clock), so that emulation can be tested on a clock the test moves: a
// padded phase, a turn within a step and a wait for a core then have exact expectations instead of
// wall-time bounds that a loaded host breaks.
#pragma once

#include <cstdint>

namespace chorus::device {

// Implementations must be safe to call from several threads (a CUDA backward's hooks read the
// clock on autograd's device threads). All values in nanoseconds.
class EmulationClock {
 public:
  virtual ~EmulationClock() = default;

  // A monotonic wall clock (steady_clock on the host).
  virtual std::int64_t nowNanos() = 0;
  // CPU time of the calling thread (CLOCK_THREAD_CPUTIME_ID on the host).
  virtual std::int64_t threadCpuNanos() = 0;
  // How long the calling thread has waited runnable for a core in all (the kernel's run delay,
  // /proc/thread-self/schedstat), or -1 where unknown.
  virtual std::int64_t threadRunDelayNanos() = 0;
  // Blocks the calling thread for `nanos` (> 0); may wake late, never early.
  virtual void sleepFor(std::int64_t nanos) = 0;

  // The host's clocks. Stateless; lives for the whole program.
  static EmulationClock& host();
};

}  // namespace chorus::device
