#include "shm_transport.h"

#include <future>

#include "chorus/core/error.h"
#include "work_state.h"

namespace chorus::comm {
namespace {

// How long a thread spins before it blocks, waiting for an operation to finish (the caller) or to
// arrive (the transport thread). Back-to-back operations (gradient buckets, benchmarks) then pass
// without a wake-up; 50 µs is too short to matter to a peer that needs the core.
constexpr std::chrono::microseconds kHandoffSpin{50};

}  // namespace

void ShmWork::complete(std::exception_ptr error) {
  finish(std::move(error));
  done_.store(true, std::memory_order_release);
}

bool ShmWork::wait(std::chrono::milliseconds timeout) {
  spinFor(kHandoffSpin, [this] { return done_.load(std::memory_order_acquire); });
  return c10d::Work::wait(timeout);
}

ShmTransport::ShmTransport(std::unique_ptr<ShmSegment> segment, int rank,
                           std::shared_ptr<GroupContext> group)
    : segment_(std::move(segment)),
      sync_(*segment_, rank, std::move(group)),
      collectives_(*segment_, sync_, rank) {
  auto ready = std::make_shared<std::promise<void>>();
  std::future<void> started = ready->get_future();
  thread_ = std::thread([this, ready] {
    try {
      sync_.holdAlive();
      ready->set_value();
    } catch (...) {
      ready->set_exception(std::current_exception());
      return;
    }
    serve();
  });
  try {
    started.get();  // the thread's first action: locking a mutex nobody else holds
  } catch (...) {
    thread_.join();
    throw;
  }
}

ShmTransport::~ShmTransport() {
  std::deque<Job> pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    if (running_) running_->abort();
    pending.swap(queue_);
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (Job& job : pending)
    job.work->complete(std::make_exception_ptr(
        CommError(detail::concat(job.context.operation, " #", job.context.sequence,
                                 ": the communicator was destroyed before the operation ran"),
                  __FILE__, __LINE__)));
}

c10::intrusive_ptr<c10d::Work> ShmTransport::submit(const ShmWaitContext& ticket, Body body) {
  auto work = c10::make_intrusive<ShmWork>();
  Job job{ticket, std::move(body), work};
  job.context.cancel = &work->cancel;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(job));
    queued_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_one();
  return work;
}

void ShmTransport::serve() {
  for (;;) {
    Job job;
    spinFor(kHandoffSpin, [this] { return queued_.load(std::memory_order_acquire) > 0; });
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (stop_) break;
      job = std::move(queue_.front());
      queue_.pop_front();
      queued_.fetch_sub(1, std::memory_order_relaxed);
      running_ = job.work;
    }
    execute(job);
    std::lock_guard<std::mutex> lock(mutex_);
    running_.reset();
  }
  sync_.releaseAlive();
}

void ShmTransport::execute(Job& job) {
  if (!failure_.empty()) {
    job.work->complete(std::make_exception_ptr(
        CommError(detail::concat(job.context.operation, " #", job.context.sequence,
                                 ": the shm transport is broken by an earlier failure: ", failure_),
                  __FILE__, __LINE__)));
    return;
  }
  try {
    job.body(collectives_, job.context);
    job.work->complete(nullptr);
  } catch (const std::exception& error) {
    // The ranks are now at different steps of the segment: no later operation can run on it.
    failure_ = error.what();
    sync_.markFailed();
    job.work->complete(std::current_exception());
  }
}

c10::intrusive_ptr<c10d::Work> ShmTransport::allReduce(const ShmWaitContext& ticket,
                                                       at::Tensor tensor, ReduceOp op) {
  return submit(ticket, [tensor, op](ShmCollectives& shm, const ShmWaitContext& context) mutable {
    shm.allReduce(context, tensor, op);
  });
}

c10::intrusive_ptr<c10d::Work> ShmTransport::broadcast(const ShmWaitContext& ticket,
                                                       at::Tensor tensor, int root) {
  return submit(ticket, [tensor, root](ShmCollectives& shm, const ShmWaitContext& context) mutable {
    shm.broadcast(context, tensor, root);
  });
}

c10::intrusive_ptr<c10d::Work> ShmTransport::allGatherV(const ShmWaitContext& ticket,
                                                        at::Tensor input, at::Tensor output,
                                                        std::vector<int64_t> counts) {
  return submit(
      ticket, [input, output, counts](ShmCollectives& shm, const ShmWaitContext& context) mutable {
        shm.allGatherV(context, input, output, counts);
      });
}

c10::intrusive_ptr<c10d::Work> ShmTransport::reduceScatterV(const ShmWaitContext& ticket,
                                                            at::Tensor input, at::Tensor output,
                                                            std::vector<int64_t> counts,
                                                            ReduceOp op) {
  return submit(ticket, [input, output, counts, op](ShmCollectives& shm,
                                                    const ShmWaitContext& context) mutable {
    shm.reduceScatterV(context, input, output, counts, op);
  });
}

c10::intrusive_ptr<c10d::Work> ShmTransport::allToAll(const ShmWaitContext& ticket,
                                                      at::Tensor input, at::Tensor output,
                                                      std::vector<int64_t> send_counts,
                                                      std::vector<int64_t> recv_counts) {
  return submit(ticket, [input, output, send_counts, recv_counts](
                            ShmCollectives& shm, const ShmWaitContext& context) mutable {
    shm.allToAll(context, input, output, send_counts, recv_counts);
  });
}

c10::intrusive_ptr<c10d::Work> ShmTransport::barrier(const ShmWaitContext& ticket) {
  return submit(ticket,
                [](ShmCollectives& shm, const ShmWaitContext& context) { shm.barrier(context); });
}

}  // namespace chorus::comm
