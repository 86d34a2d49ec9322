// A worker's view of its job: identity, store, world communicator, device and emulation.
//
// chorus::init() builds it once at start-up from the environment the launcher set (see
// identity.h); everything else receives it explicitly. The worker owns the objects it created:
// the store client (or, for rank 0 under mpirun/srun, the store server itself), the world
// communicator, the speed emulator and the memory budget.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <optional>

#include "chorus/comm/communicator.h"
#include "chorus/comm/store/store.h"
#include "chorus/runtime/launch/identity.h"

namespace chorus::comm {
class TcpStoreServer;
struct TcpStoreOptions;
struct EtcdStoreOptions;
}  // namespace chorus::comm
namespace chorus::device {
class SpeedEmulator;
class MemoryBudget;
}  // namespace chorus::device

namespace chorus::runtime {

struct InitOptions {
  // The environment to read. Default: the process's own, read once here.
  std::optional<Environment> environment;
  // A CPU worker computes on WorkerIdentity::cpu_threads intra-op threads: 1 unless the agent
  // gave it the node's spare cores (device::intraOpThreads), rather than libtorch's default of
  // every core for each of several workers. false leaves libtorch's setting. Default: true.
  bool single_thread = true;
  // Join the world communicator now (never for a replacement worker, WorkerIdentity::replaces,
  // which joins a later generation's). Default: true.
  bool connect = true;
  // Use this store instead of the one the identity names (ranks as threads over one MemoryStore,
  // in tests). Default: none.
  std::shared_ptr<comm::Store> store;
};

// Non-copyable; created by init() and shared (std::shared_ptr) with whatever needs it. The
// accessors are thread-safe, except that regroup() (elastic recovery) changes rank(),
// worldSize() and world() on the training thread: other threads that read them must expect the
// values of either generation. The communicator has its own rules (communicator.h).
class Worker {
 public:
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  const WorkerIdentity& identity() const { return identity_; }
  int rank() const { return identity_.rank; }
  int worldSize() const { return identity_.world_size; }
  // The rank this worker was launched as. It names the worker for good (logs, the elastic
  // membership), while rank() is its place in the current generation's world.
  int member() const { return member_; }
  // Elastic recovery: this worker is `rank` of `world_size` in a new world communicator (of the
  // surviving members, over the same store).
  void regroup(int rank, int world_size, std::shared_ptr<comm::Communicator> world);
  // A store client of its own (a new connection to the job's TCP store or etcd), for a thread
  // that must not queue behind the training thread's blocking store calls; the store itself when
  // it is neither (an in-memory store serves threads concurrently).
  std::shared_ptr<comm::Store> openStoreConnection() const;
  // The options the world communicator was created with (deadline, transport, address, host).
  comm::CommOptions worldOptions() const;
  // The libtorch device this worker computes on (cpu, or cuda:N).
  c10::Device device() const;
  std::shared_ptr<comm::Store> store() const { return store_; }
  // The communicator of all ranks; null when InitOptions::connect was false, and for a replacement
  // worker until it joined.
  std::shared_ptr<comm::Communicator> world() const { return world_; }
  device::SpeedEmulator& emulator() const { return *emulator_; }
  // A new emulator at `speed` measuring compute the way this worker's device needs (thread CPU
  // time on a CPU, wall time on a GPU; see device::TimeBasis), with the worker's turn on shared
  // cores (WorkerIdentity::emulation_offset) while it still fits the window. emulator() is one at
  // the spec's speed; this is for callers that change the speed (test hooks).
  std::unique_ptr<device::SpeedEmulator> makeEmulator(double speed) const;
  // Starts enforcing the device spec's memory budget (a no-op without one) and returns it (null
  // for a CUDA device, whose caching allocator is capped instead: device::capCudaMemory). Done
  // on request, not in init(): what the worker allocated before (its dataset, say) is the host's,
  // not the emulated device's, and should not count.
  std::shared_ptr<device::MemoryBudget> enforceMemoryBudget();
  // The enforced budget, or null.
  std::shared_ptr<device::MemoryBudget> memoryBudget() const { return budget_; }

 private:
  friend std::shared_ptr<Worker> init(const InitOptions& options);
  explicit Worker(WorkerIdentity identity);

  WorkerIdentity identity_;
  int member_ = 0;
  std::unique_ptr<comm::TcpStoreServer> hosted_store_;
  // How store_ was connected, when it is a TCP store client (openStoreConnection).
  std::shared_ptr<const comm::TcpStoreOptions> store_client_;
  // How store_ was connected, when it is an etcd client (WorkerIdentity::store_backend).
  std::shared_ptr<const comm::EtcdStoreOptions> etcd_client_;
  std::shared_ptr<comm::Store> store_;
  std::shared_ptr<comm::Communicator> world_;
  std::unique_ptr<device::SpeedEmulator> emulator_;
  std::shared_ptr<device::MemoryBudget> budget_;
  bool cuda_capped_ = false;
};

// Reads the worker's identity once, connects to the job's store and joins the world communicator.
// Throws ConfigError (bad identity), AuthError (wrong secret), TimeoutError (peers absent).
std::shared_ptr<Worker> init(const InitOptions& options = {});

}  // namespace chorus::runtime
