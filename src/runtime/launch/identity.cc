#include "chorus/runtime/launch/identity.h"

#include <unistd.h>

#include <sstream>

#include "chorus/comm/store/etcd_store.h"
#include "chorus/core/error.h"

extern char** environ;

namespace chorus::runtime {
namespace {

const std::string* find(const Environment& environment, const char* name) {
  const auto found = environment.find(name);
  return found == environment.end() ? nullptr : &found->second;
}

// Variable `name` as a number: `parse` (std::stoi, std::stod) must read all of it and `accept`
// the value, else ConfigError "... is not <what>"; `fallback` when the variable is unset.
template <typename Number, typename Parse, typename Accept>
Number readNumber(const Environment& environment, const char* name, Number fallback, Parse parse,
                  Accept accept, const char* what) {
  const std::string* text = find(environment, name);
  if (!text) return fallback;
  try {
    size_t used = 0;
    const Number value = parse(*text, &used);
    if (used == text->size() && accept(value)) return value;
  } catch (const std::logic_error&) {
  }
  CHORUS_THROW(ConfigError, "environment variable ", name, "='", *text, "' is not ", what);
}

int readInt(const Environment& environment, const char* name, int fallback) {
  return readNumber(
      environment, name, fallback,
      [](const std::string& text, size_t* used) { return std::stoi(text, used); },
      [](int value) { return value >= 0; }, "a non-negative integer");
}

double readFraction(const Environment& environment, const char* name, double fallback) {
  return readNumber(
      environment, name, fallback,
      [](const std::string& text, size_t* used) { return std::stod(text, used); },
      [](double value) { return value >= 0 && value < 1; }, "a fraction in [0, 1)");
}

std::string readString(const Environment& environment, const char* name, std::string fallback) {
  const std::string* text = find(environment, name);
  return text ? *text : fallback;
}

// Rank variables of the launchers we understand, in order of preference.
struct LauncherVars {
  const char* launcher;
  // A variable the launcher always sets, when `rank` alone is too common a name to tell it
  // (torchrun's RANK); nullptr: `rank` is enough.
  const char* marker;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
  const char* node_rank;
  const char* nodes;
};

constexpr LauncherVars kLaunchers[] = {
    {"chorus", nullptr, env::kRank, env::kWorldSize, env::kLocalRank, env::kLocalWorldSize,
     env::kNodeRank, env::kNodes},
    // Open MPI names no host index (OMPI_COMM_WORLD_NODE_RANK is a process's place among those
    // on its host): its ranks tell hosts apart by hostname (host_id).
    {"mpirun", nullptr, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", nullptr, nullptr},
    // Only srun's tasks have a step id: a batch script also has SLURM_PROCID=0 and the job's
    // SLURM_NTASKS, and must not take itself for rank 0 of the job.
    {"srun", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
     "SLURM_NTASKS_PER_NODE", "SLURM_NODEID", "SLURM_NNODES"},
    // torchrun (torch.distributed.run): its own store is PyTorch's, without the job secret, so
    // the job's store and secret come from CHORUS_RDZV_ENDPOINT and CHORUS_SECRET_FILE, as under
    // mpirun and srun.
    {"torchrun", "TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
     "GROUP_RANK", "GROUP_WORLD_SIZE"},
};

// srun's tasks on node `node` from SLURM_STEP_TASKS_PER_NODE, e.g. "2(x3),1" (nodes 0-2 run two,
// node 3 one); set whatever the task distribution, unlike SLURM_NTASKS_PER_NODE. -1 when absent.
int slurmTasksOnNode(const Environment& environment, int node) {
  const std::string* text = find(environment, "SLURM_STEP_TASKS_PER_NODE");
  if (!text) return -1;
  std::stringstream entries(*text);
  std::string entry;
  int first = 0;  // the first node the entry describes
  while (std::getline(entries, entry, ',')) {
    int tasks = 0, repeat = 1;
    const size_t open = entry.find("(x");
    try {
      size_t used = 0;
      tasks = std::stoi(entry.substr(0, open), &used);
      const bool plain = open == std::string::npos && used == entry.size();
      if (!plain) {
        const bool closed = open == used && entry.back() == ')';
        repeat = closed ? std::stoi(entry.substr(open + 2, entry.size() - open - 3), &used) : 0;
        if (!closed || used != entry.size() - open - 3) repeat = 0;
      }
    } catch (const std::logic_error&) {
      tasks = 0;
    }
    if (tasks < 1 || repeat < 1)
      CHORUS_THROW(ConfigError, "environment variable SLURM_STEP_TASKS_PER_NODE='", *text,
                   "' is not a list like 2(x3),1");
    if (node < first + repeat) return tasks;
    first += repeat;
  }
  CHORUS_THROW(ConfigError, "environment variable SLURM_STEP_TASKS_PER_NODE='", *text,
               "' describes no node ", node);
}

bool startedBy(const Environment& environment, const LauncherVars& vars) {
  return find(environment, vars.rank) && (!vars.marker || find(environment, vars.marker));
}

void readRanks(const Environment& environment, WorkerIdentity& identity) {
  for (const LauncherVars& vars : kLaunchers) {
    if (!startedBy(environment, vars)) continue;
    identity.launcher = vars.launcher;
    identity.rank = readInt(environment, vars.rank, 0);
    identity.world_size = readInt(environment, vars.size, 1);
    identity.local_rank = readInt(environment, vars.local_rank, identity.rank);
    identity.local_world_size = readInt(environment, vars.local_size, identity.world_size);
    identity.node_rank = vars.node_rank ? readInt(environment, vars.node_rank, 0) : 0;
    identity.node_known = vars.node_rank != nullptr;
    identity.nnodes = vars.nodes ? readInt(environment, vars.nodes, 1) : 1;
    if (identity.launcher == std::string("srun")) {
      const int on_node = slurmTasksOnNode(environment, identity.node_rank);
      if (on_node > 0 && !find(environment, vars.local_size)) identity.local_world_size = on_node;
    }
    return;
  }
}

void validate(const WorkerIdentity& identity) {
  // A replacement's rank is a member id drawn after the launch ranks: beyond the world size.
  if (identity.replaces >= 0 && identity.replaces >= identity.rank)
    CHORUS_THROW(ConfigError, "worker identity: ", env::kElasticReplaces, "=", identity.replaces,
                 " names no earlier rank than this worker's own, ", identity.rank);
  if (identity.replaces >= 0 && identity.new_device)
    CHORUS_THROW(ConfigError, "worker identity: ", env::kElasticReplaces, " and ",
                 env::kElasticNewDevice,
                 " both set: a joining worker either replaces a launch "
                 "rank or brings a new device");
  if (identity.new_device && identity.rank < identity.world_size)
    CHORUS_THROW(ConfigError, "worker identity: ", env::kElasticNewDevice, " is set, but rank ",
                 identity.rank, " is a launch rank (world size ", identity.world_size, ")");
  const bool rank_in_world = identity.rank < identity.world_size || identity.joins();
  if (identity.world_size < 1 || !rank_in_world)
    CHORUS_THROW(ConfigError, "worker identity: rank ", identity.rank, " is outside world size ",
                 identity.world_size, " (launcher: ", identity.launcher, ")");
  if (identity.elastic && identity.launcher != "chorus")
    CHORUS_THROW(ConfigError, "worker identity: ", env::kElastic,
                 " is set by `chorus run --elastic`, but this worker was started by ",
                 identity.launcher,
                 ", which does not keep the other workers running when one fails");
  if (identity.cpu_threads < 1)
    CHORUS_THROW(ConfigError, "worker identity: ", env::kCpuThreads, " must be >= 1, got ",
                 identity.cpu_threads);
  if (identity.local_rank >= identity.local_world_size)
    CHORUS_THROW(ConfigError, "worker identity: local rank ", identity.local_rank,
                 " is outside local world size ", identity.local_world_size);
  if (identity.world_size > 1 && !identity.hasStore())
    CHORUS_THROW(ConfigError, "worker identity: a job of ", identity.world_size,
                 " workers needs the rendezvous endpoint in ", env::kStoreEndpoint,
                 " (start workers with `chorus run`, or set it for mpirun/srun)");
  if (identity.hasStore() && identity.secret_fd < 0 && identity.secret_file.empty())
    CHORUS_THROW(ConfigError, "worker identity: the job secret is missing (", env::kSecretFile,
                 " names a mode-600 file holding it; `chorus run` passes it as ", env::kSecretFd,
                 ")");
}

}  // namespace

std::string hostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0)
    CHORUS_THROW(ConfigError, "worker identity: cannot read this host's name (gethostname)");
  return name;
}

std::string launcherOf(const Environment& environment) {
  for (const LauncherVars& vars : kLaunchers)
    if (startedBy(environment, vars)) return vars.launcher;
  return "none";
}

std::pair<std::string, int> parseEndpoint(const std::string& endpoint) {
  const size_t colon = endpoint.rfind(':');
  std::string host = colon == std::string::npos ? "" : endpoint.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  int port = -1;
  try {
    size_t used = 0;
    const std::string text = endpoint.substr(colon + 1);
    port = std::stoi(text, &used);
    if (used != text.size()) port = -1;
  } catch (const std::logic_error&) {
  }
  if (colon == std::string::npos || host.empty() || port < 0 || port > 65535)
    CHORUS_THROW(ConfigError, "invalid endpoint '", endpoint,
                 "': expected HOST:PORT, e.g. 10.0.0.1:29500");
  return {host, port};
}

WorkerIdentity identityFromEnvironment(const Environment& environment) {
  WorkerIdentity identity;
  readRanks(environment, identity);
  std::string device = readString(environment, env::kDevice, "");
  if (device.empty() && find(environment, env::kDevices)) {
    const auto devices = parseDeviceSpecs(*find(environment, env::kDevices));
    device = devices.at(identity.local_rank % devices.size()).toString();
  }
  if (!device.empty()) identity.device = parseDeviceSpec(device);
  identity.store_backend = readString(environment, env::kStoreBackend, identity.store_backend);
  if (identity.store_backend != "tcp" && identity.store_backend != "etcd")
    CHORUS_THROW(ConfigError, "environment variable ", env::kStoreBackend, "='",
                 identity.store_backend, "' is not tcp or etcd");
  if (const std::string* endpoint = find(environment, env::kStoreEndpoint)) {
    if (identity.store_backend == "etcd") {
      identity.etcd_endpoints = comm::parseEtcdEndpoints(*endpoint);
      std::tie(identity.store_host, identity.store_port) =
          parseEndpoint(identity.etcd_endpoints.front());
    } else {
      std::tie(identity.store_host, identity.store_port) = parseEndpoint(*endpoint);
    }
  }
  if (find(environment, env::kSecretInEnvironment))
    CHORUS_THROW(ConfigError, "worker identity: ", env::kSecretInEnvironment,
                 " is set, but a job secret in the environment is readable by every process of "
                 "this user (/proc/PID/environ) and is not accepted; put it in a mode-600 file "
                 "and set ",
                 env::kSecretFile, " instead");
  identity.secret_fd = readInt(environment, env::kSecretFd, -1);
  identity.secret_file = readString(environment, env::kSecretFile, "");
  identity.bind_address = readString(environment, env::kBindAddress, identity.bind_address);
  identity.host_id =
      readString(environment, env::kHostId,
                 identity.node_known ? "node" + std::to_string(identity.node_rank) : hostName());
  identity.timeout_ms = readInt(environment, env::kTimeoutMs, identity.timeout_ms);
  identity.cpu_transport = readString(environment, env::kCpuTransport, identity.cpu_transport);
  identity.log_level = readString(environment, env::kLogLevel, identity.log_level);
  identity.emulation_offset = readFraction(environment, env::kEmulationOffset, 0);
  identity.cpu_threads = readInt(environment, env::kCpuThreads, 1);
  identity.replaces = readInt(environment, env::kElasticReplaces, -1);
  identity.new_device = readInt(environment, env::kElasticNewDevice, 0) != 0;
  identity.elastic = readInt(environment, env::kElastic, 0) != 0;
  validate(identity);
  return identity;
}

Environment processEnvironment() {
  Environment environment;
  for (char** entry = environ; entry && *entry; ++entry) {
    const std::string text(*entry);
    const size_t equals = text.find('=');
    if (equals != std::string::npos) environment[text.substr(0, equals)] = text.substr(equals + 1);
  }
  return environment;
}

}  // namespace chorus::runtime
