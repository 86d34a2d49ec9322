// The workers a node's agent starts: their environments (launch/worker_launches.h).
#include "launch/worker_launches.h"

#include "chorus/comm/store/etcd_store.h"
#include "chorus/core/logging.h"
#include "chorus/device/host_sharing.h"
#include "chorus/runtime/launch/identity.h"

namespace chorus::runtime {
namespace {

constexpr const char* kGlibcTunables = "GLIBC_TUNABLES";

// The malloc settings workers get: none when the user set GLIBC_TUNABLES (workers inherit it).
std::string workerMallocTunables(const AgentOptions& options) {
  if (options.malloc_tunables.empty() || processEnvironment().count(kGlibcTunables) > 0) return "";
  return options.malloc_tunables;
}

// Step offsets of this node's emulated CPU workers (device::staggerOffsets), by local index: the
// workers whose speeds leave room take turns within a data-parallel step rather than all
// computing at once (the trainer's SpeedEmulator::beginStep; pipeline stages do not stagger).
// Logs them.
std::vector<double> emulationOffsets(const std::vector<DeviceSpec>& devices, int cores) {
  std::vector<size_t> cpus;
  std::vector<double> speeds;
  for (size_t local = 0; local < devices.size(); ++local) {
    if (devices[local].kind != DeviceKind::kCpu) continue;
    cpus.push_back(local);
    speeds.push_back(devices[local].speed);
  }
  const std::vector<double> staggered = device::staggerOffsets(speeds, cores);
  std::vector<double> offsets(devices.size(), 0.0);
  std::string described;
  for (size_t i = 0; i < cpus.size(); ++i) {
    offsets[cpus[i]] = staggered[i];
    if (staggered[i] > 0)
      described += detail::concat(described.empty() ? "" : ", ", devices[cpus[i]].toString(),
                                  " at ", staggered[i]);
  }
  if (!described.empty())
    logInfo("chorus run: ", devices.size(), " workers on ", cores,
            " cores take turns within a data-parallel step, so that fewer compute at once: ",
            described, " of its emulated compute time");
  return offsets;
}

// Intra-op threads of this node's workers (device::intraOpThreads), by local index; logs those
// given more than one.
std::vector<int> workerThreads(const std::vector<DeviceSpec>& devices, int cores, int requested) {
  const std::vector<int> threads = device::intraOpThreads(devices, cores, requested);
  for (size_t local = 0; local < devices.size(); ++local)
    if (threads[local] > 1)
      logInfo("chorus run: ", devices[local].toString(), " computes on ", threads[local],
              " threads (", requested > 0 ? "cpu_threads" : "the node's spare cores", ")");
  return threads;
}

}  // namespace

std::vector<WorkerLaunch> describeWorkers(const AgentOptions& options,
                                          const std::vector<DeviceSpec>& devices, int cores,
                                          const NodeSlot& slot, const std::string& store_endpoint,
                                          const comm::JobSecret& secret) {
  // etcd's endpoints are a list: the route toward its first member picks the address to bind.
  const bool etcd = options.rdzv_backend == "etcd";
  const auto [store_host, store_port] =
      parseEndpoint(etcd ? comm::parseEtcdEndpoints(store_endpoint).front() : store_endpoint);
  const std::string bind =
      options.nnodes > 1 ? localAddressToward(store_host, store_port) : "127.0.0.1";
  const std::string malloc_tunables = workerMallocTunables(options);
  const std::vector<double> offsets = emulationOffsets(devices, cores);
  const std::vector<int> threads = workerThreads(devices, cores, options.cpu_threads);
  std::vector<WorkerLaunch> workers;
  for (size_t local = 0; local < devices.size(); ++local) {
    WorkerLaunch worker;
    worker.rank = slot.rank_offset + static_cast<int>(local);
    worker.argv = options.command;
    worker.env = {
        {env::kRank, std::to_string(worker.rank)},
        {env::kWorldSize, std::to_string(slot.world_size)},
        {env::kLocalRank, std::to_string(local)},
        {env::kLocalWorldSize, std::to_string(devices.size())},
        {env::kNodeRank, std::to_string(options.node_rank)},
        {env::kNodes, std::to_string(options.nnodes)},
        {env::kDevice, devices[local].toString()},
        {env::kStoreEndpoint, store_endpoint},
        {env::kBindAddress, bind},
        {env::kHostId, "node" + std::to_string(options.node_rank)},
        {env::kTimeoutMs, std::to_string(options.comm_timeout.count())},
        {env::kCpuTransport, options.cpu_transport},
        {env::kLogLevel, options.log_level},
    };
    worker.secret = secret;  // through an inherited pipe, never the environment
    if (etcd) worker.env[env::kStoreBackend] = "etcd";
    if (options.elastic) worker.env[env::kElastic] = "1";
    if (!malloc_tunables.empty()) worker.env[kGlibcTunables] = malloc_tunables;
    if (offsets[local] > 0) worker.env[env::kEmulationOffset] = std::to_string(offsets[local]);
    if (threads[local] > 1) worker.env[env::kCpuThreads] = std::to_string(threads[local]);
    worker.env.insert(options.worker_environment.begin(), options.worker_environment.end());
    workers.push_back(std::move(worker));
  }
  return workers;
}

}  // namespace chorus::runtime
