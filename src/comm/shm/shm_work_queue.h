// Private to comm: the ordered job queue of the shared-memory transport, and its Work handle.
//
// Every shm operation of a rank must run in issue order, one at a time (all ranks step through
// the same barriers). Which thread runs it is free, and that is where the time of a small
// operation goes: handing it to a background thread and waiting for the result costs a wake-up
// on each side, and on a host with as many cores as ranks the waiting caller and the working
// thread fight for one core. So a job runs on whichever thread gets to it first:
//
//   - the caller's thread, when it waits for a job that has not started while no other job is
//     running (it then runs the earlier queued jobs too, in order): a collective issued and
//     waited at once costs no thread switch at all;
//   - the queue's own thread otherwise: operations issued and not waited (gradient buckets from
//     autograd hooks) still run in the background, overlapping the backward pass. While callers
//     run their own jobs, the thread is not woken per job but naps (1 ms) and takes what is left
//     unclaimed, so a job nobody waits for starts within a nap.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>

#include "shm/shm_sync.h"

namespace chorus::comm {

class ShmWorkQueue;

// The c10d handle of one shm operation. wait() runs the operation on the calling thread when it
// has not started and nothing else is running; otherwise it spins briefly (a small operation
// finishes within microseconds, sooner than a sleeping thread is woken) and then blocks.
// abort() (called by Work::wait when the caller gave up) makes the operation's waits stop at
// their next check.
class ShmWork : public c10d::Work {
 public:
  explicit ShmWork(std::shared_ptr<ShmWorkQueue> queue)
      : c10d::Work(-1, c10d::OpType::UNKNOWN), queue_(std::move(queue)) {}
  void complete(std::exception_ptr error);
  bool wait(std::chrono::milliseconds timeout) override;
  void abort() override { cancel.store(true); }
  bool done() const { return done_.load(std::memory_order_acquire); }
  std::atomic<bool> cancel{false};

 private:
  // Kept for the work's life: small, and inert once stopped. The queue holds the work only
  // until the job ran, so the two never keep each other alive for long.
  const std::shared_ptr<ShmWorkQueue> queue_;
  std::atomic<bool> done_{false};
};

// Runs the jobs of one rank in submission order, one at a time, each on the queue's thread or on
// a waiting caller's thread (see the file comment). Thread-safe. Shared by the transport and the
// pending works; stop() must be called before the objects that `execute` uses go away.
class ShmWorkQueue : public std::enable_shared_from_this<ShmWorkQueue> {
 public:
  struct Job {
    ShmWaitContext context;  // its `cancel` points at the work's flag
    std::function<void(const ShmWaitContext&)> body;
    c10::intrusive_ptr<ShmWork> work;
  };
  // Runs one job's body; returns its failure (null: it ran), never throws. The queue then
  // completes the job's work (finish()). Called by one thread at a time.
  using Executor = std::function<std::exception_ptr(Job&)>;

  explicit ShmWorkQueue(Executor execute) : execute_(std::move(execute)) {}
  ShmWorkQueue(const ShmWorkQueue&) = delete;
  ShmWorkQueue& operator=(const ShmWorkQueue&) = delete;

  // Queues a job; the returned work completes when it ran (or failed).
  c10::intrusive_ptr<ShmWork> submit(const ShmWaitContext& ticket,
                                     std::function<void(const ShmWaitContext&)> body);
  // On the calling thread, runs the queued jobs up to and including `work`'s, provided `work` is
  // still queued and no other thread is running a job. Returns whether it did.
  bool runUpTo(const ShmWork* work);
  // The body of the queue's own thread: runs jobs that no caller claimed, until stop().
  void serve();
  // Cancels the running job and waits until it ended; fails the queued jobs with CommError;
  // ends serve(). Later submissions fail at once.
  void stop();

 private:
  // REQUIRES: executing_ was set by this thread; `lock` holds mutex_. Runs `job` unlocked.
  void runLocked(std::unique_lock<std::mutex>& lock, Job job);
  static void fail(Job& job, const char* why);
  // Releases the job's body (its captured tensors), then completes its work with `error`: the
  // waiter holds the last references and frees them on its own thread.
  static void finish(Job& job, std::exception_ptr error);

  Executor execute_;
  std::mutex mutex_;
  std::condition_variable wake_;  // the queue's thread: a job to run, or stop
  std::condition_variable idle_;  // stop(): the running job ended
  std::deque<Job> queue_;
  bool executing_ = false;  // some thread is running a job
  // Whether submit() wakes the queue's thread; false while callers run their own jobs (the
  // thread then naps, see kNap in the .cc).
  bool wake_on_submit_ = true;
  std::uint64_t submitted_ = 0;
  c10::intrusive_ptr<ShmWork> running_;
  bool stopped_ = false;
};

}  // namespace chorus::comm
