// Private to comm: the shared-memory transport for CPU collectives among the ranks of one host.
//
// A Communicator whose members all run on one host (see connectShm) issues its CPU collectives
// here instead of to Gloo. Each operation is queued (shm_work_queue.h) and runs in issue order
// (the order all ranks agree on), either on the caller's thread when it waits for it at once, or
// on the transport's own thread; the caller returns at once, as with Gloo, so gradient buckets
// launched from autograd hooks overlap with the backward pass. The thread holds the rank's
// "alive" mutex in the segment for its whole life, which is how peers notice a rank that died or
// left.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "chorus/comm/communicator.h"
#include "chorus/comm/store/store.h"
#include "shm/shm_collectives.h"
#include "shm/shm_segment.h"
#include "shm/shm_sync.h"
#include "shm/shm_work_queue.h"

namespace chorus::comm {

struct GroupContext;

// Owns the segment mapping, the job queue and the transport thread. The operation methods may be
// called from one thread at a time (the Communicator's rule); the returned Work waited from any
// thread. On destruction, queued operations fail with CommError and the running one is cancelled.
class ShmTransport {
 public:
  ShmTransport(std::unique_ptr<ShmSegment> segment, int rank, std::shared_ptr<GroupContext> group);
  ~ShmTransport();
  ShmTransport(const ShmTransport&) = delete;
  ShmTransport& operator=(const ShmTransport&) = delete;

  std::size_t chunkBytes() const { return segment_->chunkBytes(); }

  // `ticket` names the operation and carries its deadline; tensors are captured until done.
  c10::intrusive_ptr<c10d::Work> allReduce(const ShmWaitContext& ticket, at::Tensor tensor,
                                           ReduceOp op);
  c10::intrusive_ptr<c10d::Work> broadcast(const ShmWaitContext& ticket, at::Tensor tensor,
                                           int root);
  c10::intrusive_ptr<c10d::Work> allGatherV(const ShmWaitContext& ticket, at::Tensor input,
                                            at::Tensor output, std::vector<int64_t> counts);
  c10::intrusive_ptr<c10d::Work> reduceScatterV(const ShmWaitContext& ticket, at::Tensor input,
                                                at::Tensor output, std::vector<int64_t> counts,
                                                ReduceOp op);
  c10::intrusive_ptr<c10d::Work> allToAll(const ShmWaitContext& ticket, at::Tensor input,
                                          at::Tensor output, std::vector<int64_t> send_counts,
                                          std::vector<int64_t> recv_counts);
  c10::intrusive_ptr<c10d::Work> barrier(const ShmWaitContext& ticket);

 private:
  using Body = std::function<void(ShmCollectives&, const ShmWaitContext&)>;

  c10::intrusive_ptr<c10d::Work> submit(const ShmWaitContext& ticket, Body body);
  // Runs one job on whichever thread the queue chose; one at a time.
  std::exception_ptr execute(ShmWorkQueue::Job& job);

  std::unique_ptr<ShmSegment> segment_;
  ShmSync sync_;
  ShmCollectives collectives_;
  std::shared_ptr<ShmWorkQueue> queue_;
  std::string failure_;  // the first failure; every later operation fails with it
  std::thread thread_;
};

struct ShmSetup {
  // Fail (instead of returning null) when the group cannot use shared memory.
  bool required = false;
  // Bytes of one chunk buffer (each rank has two).
  std::size_t chunk_bytes = 0;
  std::chrono::milliseconds timeout{60000};
  // The host this rank declares (CommOptions::host_id), set for subgroups only. Members that
  // declare different hosts then never share memory, even on one machine: the topology puts a
  // network link between them (emulated hosts in tests, two agents of one machine given
  // different node ranks). Default: empty (the machine alone decides).
  std::string host_id;
};

// Collective, at group creation: the members exchange their machine identity (boot id, host
// name and declared host id) through `store` (the group's namespace); when all are on one machine,
// rank 0 creates a segment named after the group and a random nonce, the others map it, and all
// report back. Returns the transport when every member mapped the segment; otherwise null, or
// CommError / ConfigError when setup.required. Every member returns the same outcome.
std::unique_ptr<ShmTransport> connectShm(Store& store, int rank, int size, const ShmSetup& setup,
                                         std::shared_ptr<GroupContext> group);

}  // namespace chorus::comm
