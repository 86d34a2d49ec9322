#include "shm/shm_sync.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <ctime>

#include "chorus/core/error.h"
#include "work_state.h"

namespace chorus::comm {
namespace {

// How long a waiter spins before it sleeps, when the rank it waits for last ran on another CPU:
// long enough for a peer on the SMT sibling to finish a chunk's copy (it then arrives sooner than
// a futex wake-up); short enough not to steal a shared core from a peer that is still computing.
// A rank that last ran on the waiter's own CPU cannot run, let alone arrive, while the waiter
// spins, so the waiter sleeps at once: on this 2-core host with one core taken by another
// process, where the two ranks share the other, spinning added 40 µs to a 1 MiB all-reduce per
// wait (165 µs against 76 µs).
constexpr std::chrono::microseconds kSpin{40};
// Longest futex sleep between checks of the deadline, cancellation and peers' liveness.
constexpr std::chrono::milliseconds kSleepSlice{5};

void futexWait(std::atomic<std::uint32_t>* word, std::uint32_t expected,
               std::chrono::milliseconds limit) {
  struct timespec relative {};
  relative.tv_sec = static_cast<time_t>(limit.count() / 1000);
  relative.tv_nsec = static_cast<long>((limit.count() % 1000) * 1000000);
  // Not FUTEX_PRIVATE: the word is shared between processes (keyed by page, not address).
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT, expected, &relative,
            nullptr, 0);
}

void futexWakeAll(std::atomic<std::uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr,
            nullptr, 0);
}

// The CPU the calling thread runs on (glibc reads it from the rseq area: no system call).
std::uint32_t currentCpu() {
  const int cpu = ::sched_getcpu();
  return cpu < 0 ? kShmUnknownCpu : static_cast<std::uint32_t>(cpu);
}

// Wrap-safe "counter has reached target" for 32-bit step counters.
bool atLeast(std::uint32_t counter, std::uint32_t target) {
  return static_cast<std::int32_t>(counter - target) >= 0;
}

}  // namespace

ShmSync::ShmSync(const ShmSegment& segment, int rank, std::shared_ptr<GroupContext> group)
    : segment_(segment), rank_(rank), group_(std::move(group)) {}

void ShmSync::holdAlive() {
  ShmRankControl& mine = segment_.control(rank_);
  const int error = pthread_mutex_lock(&mine.alive);
  if (error != 0 && error != EOWNERDEAD)
    CHORUS_THROW(CommError, "shm: cannot mark rank ", rank_, " alive: error ", error);
  if (error == EOWNERDEAD) pthread_mutex_consistent(&mine.alive);
  holding_ = true;
}

void ShmSync::releaseAlive() {
  ShmRankControl& mine = segment_.control(rank_);
  if (mine.status.load() == kShmActive) mine.status.store(kShmLeft);
  if (holding_) pthread_mutex_unlock(&mine.alive);
  holding_ = false;
  // Wake sleepers so that they notice at once rather than at their next check.
  futexWakeAll(&mine.arrived);
}

void ShmSync::markFailed() {
  ShmRankControl& mine = segment_.control(rank_);
  mine.status.store(kShmFailed);
  futexWakeAll(&mine.arrived);
}

void ShmSync::arrive() {
  ShmRankControl& mine = segment_.control(rank_);
  mine.cpu.store(currentCpu(), std::memory_order_relaxed);
  ++step_;
  // seq_cst store then seq_cst load, against the sleeper's increment then load: one of the two
  // sides sees the other, so a wake-up is never lost.
  mine.arrived.store(step_);
  if (mine.sleepers.load() != 0) futexWakeAll(&mine.arrived);
}

bool ShmSync::reached(int peer) const {
  return atLeast(segment_.control(peer).arrived.load(std::memory_order_acquire), step_);
}

void ShmSync::sleepOn(int peer, std::chrono::milliseconds limit) const {
  ShmRankControl& theirs = segment_.control(peer);
  theirs.sleepers.fetch_add(1);
  const std::uint32_t seen = theirs.arrived.load();
  if (!atLeast(seen, step_) && theirs.status.load() == kShmActive)
    futexWait(&theirs.arrived, seen, limit);
  theirs.sleepers.fetch_sub(1);
}

void ShmSync::barrier(const ShmWaitContext& context) {
  arrive();
  waitAll(context);
}

void ShmSync::waitAll(const ShmWaitContext& context) {
  for (int peer = 0; peer < segment_.size(); ++peer) {
    if (peer == rank_ || reached(peer)) continue;
    const bool elsewhere =
        segment_.control(peer).cpu.load(std::memory_order_relaxed) != currentCpu();
    if (elsewhere && spinFor(kSpin, [this, peer] { return reached(peer); })) continue;
    while (!reached(peer)) {
      checkWaiting(context, peer);
      const auto left = context.deadline.remaining();
      sleepOn(peer, std::max(std::chrono::milliseconds(1), std::min(left, kSleepSlice)));
    }
  }
  std::atomic_thread_fence(std::memory_order_acquire);
}

std::vector<int> ShmSync::laggards() const {
  std::vector<int> behind;
  for (int peer = 0; peer < segment_.size(); ++peer)
    if (peer != rank_ && !reached(peer)) behind.push_back(peer);
  return behind;
}

std::vector<int> ShmSync::globalRanks(const std::vector<int>& ranks) const {
  std::vector<int> global;
  for (int rank : ranks)
    global.push_back(group_->global_ranks.empty() ? rank : group_->global_ranks.at(rank));
  return global;
}

std::string ShmSync::where(const ShmWaitContext& context) const {
  return detail::concat(context.operation, " #", context.sequence, " in group '", group_->name,
                        "'");
}

void ShmSync::checkWaiting(const ShmWaitContext& context, int peer) {
  if (context.cancel && context.cancel->load())
    CHORUS_THROW(CommError, where(context), " was aborted");
  if (group_->aborted.load()) {
    std::lock_guard<std::mutex> lock(group_->failure_mutex);
    CHORUS_THROW(CommError, where(context), " was aborted: ", group_->failure);
  }
  ShmRankControl& theirs = segment_.control(peer);
  std::uint32_t status = theirs.status.load();
  if (status == kShmActive) {
    // Free, or abandoned by a dead owner: the rank's transport thread is gone.
    const int error = pthread_mutex_trylock(&theirs.alive);
    if (error == 0 || error == EOWNERDEAD) {
      status = kShmLeft;
      theirs.status.store(kShmLeft);
      if (error == EOWNERDEAD) pthread_mutex_consistent(&theirs.alive);
      // Let go at once: a robust mutex this thread holds stays on its robust list, which would
      // point into the segment after it is unmapped, and glibc writes through that list when the
      // thread takes its next robust mutex (a later group's).
      pthread_mutex_unlock(&theirs.alive);
    }
  }
  // The caller saw the peer not arrived, then this read its status: a peer that arrived in
  // between and then left (its last operation done) or failed a later operation is not missing
  // here. It arrived before it changed its status (or released its mutex), so, having seen that
  // change, this sees the arrival too.
  if (status != kShmActive && reached(peer)) return;
  if (status == kShmLeft) {
    const std::vector<int> lost = globalRanks({peer});
    throw PeerFailure(detail::concat(where(context), " lost a peer: rank ", joinInts(lost),
                                     " died or left the group (transport: shm)"),
                      __FILE__, __LINE__, lost);
  }
  if (status == kShmFailed)
    CHORUS_THROW(CommError, where(context), " failed: rank ", joinInts(globalRanks({peer})),
                 " failed an earlier step (transport: shm)");
  if (context.deadline.expired()) {
    const std::vector<int> missing = globalRanks(laggards());
    throw TimeoutError(
        detail::concat(where(context), " timed out after ", context.timeout.count(),
                       " ms; ranks not arrived: ", joinInts(missing), " (transport: shm)"),
        __FILE__, __LINE__, context.operation, context.sequence, missing);
  }
}

}  // namespace chorus::comm
