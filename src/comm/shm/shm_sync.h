// Private to comm: synchronization of the ranks that share a ShmSegment.
//
// A barrier step is one counter per rank: a rank arrives by storing its step number, and waits
// until every peer's counter reached it. Waiting spins briefly (peers on SMT siblings arrive
// within microseconds) unless the peer last ran on the waiter's CPU (then it cannot arrive while
// the waiter spins), then sleeps on the peer's counter with a futex, waking at least every few
// milliseconds to check the deadline, cancellation and whether the peer is still alive (its
// robust mutex) or said it failed. Every wait ends in time: TimeoutError naming the ranks that
// did not arrive, PeerFailure naming the ranks that died or left, or CommError.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chorus/core/clock.h"
#include "shm/shm_segment.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace chorus::comm {

struct GroupContext;

// Tells the core that this thread is spinning (x86 pause), so an SMT sibling gets the pipeline.
inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Spins with cpuRelax() while `ready()` is false, for at most `limit` (the clock is read every
// 16 spins); returns ready().
template <typename Ready>
bool spinFor(std::chrono::nanoseconds limit, Ready ready) {
  const auto until = Clock::now() + limit;
  for (int spins = 1;; ++spins) {
    if (ready()) return true;
    if ((spins & 15) == 0 && Clock::now() >= until) return ready();
    cpuRelax();
  }
}

// Who is waiting, for error messages, and until when.
struct ShmWaitContext {
  std::string operation;
  long long sequence = -1;
  Deadline deadline = Deadline::never();
  std::chrono::milliseconds timeout{0};
  const std::atomic<bool>* cancel = nullptr;  // set by abort(); may be null
};

// One rank's side of the barriers. Not thread-safe: used by one thread at a time, whichever runs
// the rank's operations (see ShmWorkQueue), except holdAlive()/releaseAlive() which the
// transport's own thread calls at its start and end.
class ShmSync {
 public:
  ShmSync(const ShmSegment& segment, int rank, std::shared_ptr<GroupContext> group);
  ShmSync(const ShmSync&) = delete;
  ShmSync& operator=(const ShmSync&) = delete;

  // Marks this rank alive for its peers (locks its robust mutex); from the transport thread.
  void holdAlive();
  // Marks this rank as gone; from the transport thread, before it ends.
  void releaseAlive();
  // Tells peers that this rank failed an operation, so they stop waiting for it.
  void markFailed();

  // Arrives at the next step and waits until every rank arrived there.
  void barrier(const ShmWaitContext& context);
  // Arrives at the next step without waiting (for the last step of a one-way transfer).
  void arrive();
  // Waits until every rank arrived at this rank's current step.
  void waitAll(const ShmWaitContext& context);

 private:
  bool reached(int peer) const;
  void sleepOn(int peer, std::chrono::milliseconds limit) const;
  // Throws when the wait must end: a peer is dead, left or failed, cancellation, the deadline.
  void checkWaiting(const ShmWaitContext& context, int peer);
  std::vector<int> laggards() const;
  std::vector<int> globalRanks(const std::vector<int>& ranks) const;
  std::string where(const ShmWaitContext& context) const;

  const ShmSegment& segment_;
  int rank_;
  std::shared_ptr<GroupContext> group_;
  std::uint32_t step_ = 0;
  bool holding_ = false;
};

}  // namespace chorus::comm
