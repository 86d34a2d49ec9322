// Private to comm: creation of the c10d process groups that carry a Communicator's traffic.
// One file per backend (gloo_backend.cc, nccl/nccl_backend.cc or nccl/nccl_unavailable.cc); the
// build decides which files exist, the tensor's device decides at run time which one is used.
// CPU collectives of a group on one host may instead use the shared-memory transport
// (shm_transport.h), chosen at creation by capability.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "chorus/comm/communicator.h"
#include "chorus/comm/store/store.h"

namespace chorus::comm {

struct BackendArgs {
  c10::intrusive_ptr<c10d::Store> store;  // already prefixed for this backend
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{60000};
  std::string bind_address;
};

c10::intrusive_ptr<c10d::Backend> createGlooBackend(const BackendArgs& args);
// Throws CommError when this build has no NCCL, or no CUDA device is usable.
c10::intrusive_ptr<c10d::Backend> createNcclBackend(const BackendArgs& args);

struct GroupContext;
class ShmTransport;

// The process groups of one Communicator, keyed by device type. Gloo is created eagerly (it is the
// group's rendezvous); NCCL on the first CUDA tensor, which every rank meets at the same operation;
// the shared-memory transport at creation, when CommOptions::cpu_transport allows and every member
// can map it. Thread-safe. The Gloo process group of an aborted group is left alive at
// destruction (see ~Backends).
class Backends {
 public:
  Backends(std::shared_ptr<Store> store, int rank, int size, const CommOptions& options,
           std::shared_ptr<GroupContext> group);
  ~Backends();
  c10d::Backend& forTensor(const at::Tensor& tensor);
  c10d::Backend& cpu() { return *gloo_; }
  // The shared-memory transport for `tensor` (a CPU tensor in a group that uses it), else null.
  ShmTransport* shmFor(const at::Tensor& tensor) const;
  ShmTransport* shm() const { return shm_.get(); }

 private:
  BackendArgs argsFor(const std::string& prefix) const;

  std::shared_ptr<Store> store_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::string bind_address_;
  std::shared_ptr<GroupContext> group_;
  std::mutex mutex_;
  c10::intrusive_ptr<c10d::Backend> gloo_;
  c10::intrusive_ptr<c10d::Backend> nccl_;
  std::unique_ptr<ShmTransport> shm_;
};

}  // namespace chorus::comm
