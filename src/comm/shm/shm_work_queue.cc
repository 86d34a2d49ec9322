#include "shm/shm_work_queue.h"

#include <algorithm>

#include "chorus/core/error.h"

namespace chorus::comm {
namespace {

// How long a waiter spins before it blocks, when another thread runs its job: the gradient
// reducer's last buckets finish within microseconds of the wait. Short enough not to matter to
// a peer that needs the core.
constexpr std::chrono::microseconds kHandoffSpin{50};

// While callers run their own jobs, submit() does not wake the queue's thread (a wake-up per
// operation cost 10 µs of an 85 µs 1 MiB all-reduce on a 2-core host with one core taken): the
// thread naps instead and takes any job still unclaimed when it wakes, so a job nobody waits for
// starts at most this late. After this many naps with no job submitted at all it sleeps until
// woken, and the next submit() wakes it.
constexpr std::chrono::milliseconds kNap{1};
constexpr int kIdleNaps = 100;

}  // namespace

void ShmWork::complete(std::exception_ptr error) {
  finish(std::move(error));
  done_.store(true, std::memory_order_release);
}

bool ShmWork::wait(std::chrono::milliseconds timeout) {
  if (!done() && !queue_->runUpTo(this)) spinFor(kHandoffSpin, [this] { return done(); });
  return c10d::Work::wait(timeout);
}

c10::intrusive_ptr<ShmWork> ShmWorkQueue::submit(const ShmWaitContext& ticket,
                                                 std::function<void(const ShmWaitContext&)> body) {
  auto work = c10::make_intrusive<ShmWork>(shared_from_this());
  Job job{ticket, std::move(body), work};
  job.context.cancel = &work->cancel;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopped_) {
      queue_.push_back(std::move(job));
      ++submitted_;
      if (wake_on_submit_) wake_.notify_one();
      return work;
    }
  }
  fail(job, "the communicator was destroyed before the operation ran");
  return work;
}

bool ShmWorkQueue::runUpTo(const ShmWork* work) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (executing_ || stopped_) return false;
  const bool queued = std::any_of(queue_.begin(), queue_.end(),
                                  [work](const Job& job) { return job.work.get() == work; });
  if (!queued) return false;
  executing_ = true;
  bool last = false;
  while (!last && !stopped_) {
    Job job = std::move(queue_.front());
    queue_.pop_front();
    last = job.work.get() == work;
    runLocked(lock, std::move(job));
  }
  executing_ = false;
  idle_.notify_all();
  // Jobs issued after `work` (by another thread) are the queue's thread's again. And this caller
  // waits for its jobs: the thread, if it sleeps until woken, is woken once to nap instead.
  if (!queue_.empty() || wake_on_submit_) wake_.notify_one();
  wake_on_submit_ = false;
  return true;
}

void ShmWorkQueue::serve() {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto ready = [this] { return stopped_ || (!queue_.empty() && !executing_); };
  int idle_naps = 0;
  for (;;) {
    if (wake_on_submit_) {
      wake_.wait(lock, [&] { return ready() || !wake_on_submit_; });
      if (!ready()) continue;  // told to nap
    } else {
      const std::uint64_t seen = submitted_;
      if (!wake_.wait_for(lock, kNap, ready)) {
        idle_naps = submitted_ == seen ? idle_naps + 1 : 0;
        if (idle_naps >= kIdleNaps) wake_on_submit_ = true;
        continue;
      }
    }
    if (stopped_) return;
    idle_naps = 0;
    wake_on_submit_ = true;  // a job nobody waited for: the next ones may not be waited for either
    executing_ = true;
    Job job = std::move(queue_.front());
    queue_.pop_front();
    runLocked(lock, std::move(job));
    executing_ = false;
    idle_.notify_all();
  }
}

void ShmWorkQueue::stop() {
  std::deque<Job> pending;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    stopped_ = true;
    if (running_) running_->abort();
    idle_.wait(lock, [this] { return !executing_; });
    pending.swap(queue_);
  }
  wake_.notify_all();
  for (Job& job : pending) fail(job, "the communicator was destroyed before the operation ran");
}

void ShmWorkQueue::runLocked(std::unique_lock<std::mutex>& lock, Job job) {
  running_ = job.work;
  lock.unlock();
  finish(job, execute_(job));
  job = Job{};
  lock.lock();
  running_.reset();
}

void ShmWorkQueue::fail(Job& job, const char* why) {
  finish(job, std::make_exception_ptr(CommError(
                  detail::concat(job.context.operation, " #", job.context.sequence, ": ", why),
                  __FILE__, __LINE__)));
}

void ShmWorkQueue::finish(Job& job, std::exception_ptr error) {
  job.body = nullptr;
  job.work->complete(std::move(error));
}

}  // namespace chorus::comm
