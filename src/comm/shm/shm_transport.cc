#include "shm/shm_transport.h"

#include <future>

#include "chorus/core/error.h"
#include "work_state.h"

namespace chorus::comm {

ShmTransport::ShmTransport(std::unique_ptr<ShmSegment> segment, int rank,
                           std::shared_ptr<GroupContext> group)
    : segment_(std::move(segment)),
      sync_(*segment_, rank, std::move(group)),
      collectives_(*segment_, sync_, rank),
      queue_(
          std::make_shared<ShmWorkQueue>([this](ShmWorkQueue::Job& job) { return execute(job); })) {
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
    queue_->serve();
    sync_.releaseAlive();
  });
  try {
    started.get();  // the thread's first action: locking a mutex nobody else holds
  } catch (...) {
    thread_.join();
    throw;
  }
}

ShmTransport::~ShmTransport() {
  queue_->stop();
  if (thread_.joinable()) thread_.join();
}

c10::intrusive_ptr<c10d::Work> ShmTransport::submit(const ShmWaitContext& ticket, Body body) {
  return queue_->submit(ticket, [this, body = std::move(body)](const ShmWaitContext& context) {
    body(collectives_, context);
  });
}

std::exception_ptr ShmTransport::execute(ShmWorkQueue::Job& job) {
  if (!failure_.empty()) {
    return std::make_exception_ptr(
        CommError(detail::concat(job.context.operation, " #", job.context.sequence,
                                 ": the shm transport is broken by an earlier failure: ", failure_),
                  __FILE__, __LINE__));
  }
  try {
    job.body(job.context);
    return nullptr;
  } catch (const std::exception& failure) {
    // The ranks are now at different steps of the segment: no later operation can run on it.
    failure_ = failure.what();
    sync_.markFailed();
    return std::current_exception();
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
