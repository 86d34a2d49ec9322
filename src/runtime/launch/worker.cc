#include "chorus/runtime/launch/worker.h"

#include <ATen/Parallel.h>
#include <torch/version.h>

#include "chorus/chorus.h"
#include "chorus/comm/store/etcd_store.h"
#include "chorus/comm/store/job_secret.h"
#include "chorus/comm/store/memory_store.h"
#include "chorus/comm/store/tcp_store.h"
#include "chorus/core/logging.h"
#include "chorus/core/units.h"
#include "chorus/device/memory_budget.h"
#include "chorus/device/speed_emulator.h"
#include "chorus_version.h"
#include "launch/node_rendezvous.h"

namespace chorus {

const char* versionString() {
  static const std::string kVersion =
      std::string(CHORUS_VERSION) + " (libtorch " + TORCH_VERSION + ")";
  return kVersion.c_str();
}

}  // namespace chorus

namespace chorus::runtime {
namespace {

comm::JobSecret secretOf(const WorkerIdentity& identity) {
  return identity.secret_fd >= 0 ? comm::JobSecret::fromDescriptor(identity.secret_fd)
                                 : comm::JobSecret::fromFile(identity.secret_file);
}

}  // namespace

Worker::Worker(WorkerIdentity identity) : identity_(std::move(identity)), member_(identity_.rank) {}

void Worker::regroup(int rank, int world_size, std::shared_ptr<comm::Communicator> world) {
  identity_.rank = rank;
  identity_.world_size = world_size;
  world_ = std::move(world);
}

comm::CommOptions Worker::worldOptions() const {
  comm::CommOptions comm;
  comm.timeout = std::chrono::milliseconds(identity_.timeout_ms);
  comm.bind_address = identity_.bind_address;
  comm.host_id = identity_.host_id;
  comm.cpu_transport = identity_.cpu_transport;
  return comm;
}

std::shared_ptr<comm::Store> Worker::openStoreConnection() const {
  if (etcd_client_) return std::make_shared<comm::EtcdStore>(*etcd_client_);
  if (!store_client_) return store_;
  return std::make_shared<comm::TcpStore>(*store_client_);
}

Worker::~Worker() {
  // The communicator uses the store: release it first, the hosted server last.
  world_.reset();
  store_.reset();
  hosted_store_.reset();
}

std::shared_ptr<device::MemoryBudget> Worker::enforceMemoryBudget() {
  const auto& budget = identity_.device.memory_budget;
  if (!budget) return budget_;
  if (identity_.device.kind == DeviceKind::kCuda) {
    // The device's own allocator is capped; the host's memory stays unbounded.
    if (!cuda_capped_) {
      const double fraction = device::capCudaMemory(identity_.device.index, *budget);
      logInfo("memory budget ", formatBytes(*budget), " on ", identity_.device.toString(), ": ",
              static_cast<int>(fraction * 1000) / 10.0, "% of the device");
      cuda_capped_ = true;
    }
    return nullptr;
  }
  if (!budget_) budget_ = device::MemoryBudget::install(*budget);
  return budget_;
}

std::unique_ptr<device::SpeedEmulator> Worker::makeEmulator(double speed) const {
  const bool cuda = identity_.device.kind == DeviceKind::kCuda;
  auto emulator = std::make_unique<device::SpeedEmulator>(
      speed, cuda ? device::TimeBasis::kWall : device::TimeBasis::kThreadCpu);
  // The worker keeps its turn on the shared cores while it still fits its window.
  if (!cuda && identity_.emulation_offset > 0 && identity_.emulation_offset <= 1 - speed)
    emulator->setStepOffset(identity_.emulation_offset);
  return emulator;
}

c10::Device Worker::device() const {
  if (identity_.device.kind == DeviceKind::kCuda)
    return c10::Device(c10::DeviceType::CUDA,
                       static_cast<c10::DeviceIndex>(identity_.device.index));
  return c10::Device(c10::DeviceType::CPU);
}

std::shared_ptr<Worker> init(const InitOptions& options) {
  const Environment environment = options.environment ? *options.environment : processEnvironment();
  WorkerIdentity found = identityFromEnvironment(environment);
  // No agent of ours chose the address that collectives listen on (chorus run passes it): the
  // one on the route toward the store's host, as the agent picks it, unless the user says.
  if (found.launcher != "chorus" && found.hasStore() && !environment.count(env::kBindAddress))
    found.bind_address = localAddressToward(found.store_host, found.store_port);
  std::shared_ptr<Worker> worker(new Worker(std::move(found)));
  const WorkerIdentity& identity = worker->identity_;
  Logger::instance().setLevel(parseLogLevel(identity.log_level));
  // `chorus run` already prefixes every output line with the rank; other launchers do not.
  if (identity.world_size > 1 && identity.launcher != "chorus")
    Logger::instance().setPrefix("rank " + std::to_string(identity.rank));
  if (options.single_thread && identity.device.kind != DeviceKind::kCuda)
    at::set_num_threads(identity.cpu_threads);

  worker->emulator_ = worker->makeEmulator(identity.device.speed);
  // Before the communicator starts its threads, so that they inherit the priority.
  worker->emulator_->yieldCoreToFasterDevices();

  if (options.store) {
    worker->store_ = options.store;
  } else if (!identity.hasStore()) {
    worker->store_ = std::make_shared<comm::MemoryStore>();
  } else if (identity.store_backend == "etcd") {
    // No process of the job hosts it: every worker, on every node, is a client of etcd.
    comm::EtcdStoreOptions client;
    client.endpoints = identity.etcd_endpoints;
    client.prefix = comm::etcdJobPrefix(secretOf(identity));
    worker->store_ = std::make_shared<comm::EtcdStore>(client);
    worker->etcd_client_ = std::make_shared<const comm::EtcdStoreOptions>(client);
  } else {
    const comm::JobSecret secret = secretOf(identity);
    // Under mpirun/srun no agent hosts the store: rank 0 does.
    if (identity.launcher != "chorus" && identity.rank == 0) {
      comm::TcpStoreServerOptions server;
      server.port = identity.store_port;
      server.secret = secret;
      // Two connections per worker: its own and its elastic monitor's.
      server.max_connections = 2 * identity.world_size + comm::kStoreConnectionMargin;
      worker->hosted_store_ = std::make_unique<comm::TcpStoreServer>(server);
    }
    comm::TcpStoreOptions client;
    client.host = identity.store_host;
    client.port = identity.store_port;
    client.secret = secret;
    worker->store_ = std::make_shared<comm::TcpStore>(client);
    worker->store_client_ = std::make_shared<const comm::TcpStoreOptions>(client);
  }
  // A replacement of a lost worker has no place in the launch world: it joins a later generation's
  // (ElasticMembership::join).
  if (options.connect && !identity.joins())
    worker->world_ = comm::Communicator::create(worker->store_, identity.rank, identity.world_size,
                                                worker->worldOptions());
  return worker;
}

}  // namespace chorus::runtime
