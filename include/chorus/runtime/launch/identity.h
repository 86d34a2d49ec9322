// Who a worker is: its rank, the job's size, its device and where the job's store lives.
//
// The agent (`chorus run`) hands each worker its identity through CHORUS_* environment variables,
// and the job secret through an inherited pipe whose descriptor CHORUS_SECRET_FD names: never the
// secret itself in the environment, which any process of the same user can read in
// /proc/PID/environ (docs/security.md). A worker started by `mpirun`, `srun` or `torchrun` takes
// rank and size from OMPI_COMM_WORLD_*, SLURM_* or torchrun's RANK, WORLD_SIZE, ... (told by
// TORCHELASTIC_RUN_ID), and the store's endpoint and secret from CHORUS_RDZV_ENDPOINT and
// CHORUS_SECRET_FILE (a mode-600 file); rank 0 hosts the store. A process started by hand without
// any of these is a job of one. Parsing is pure (it takes the environment as a map), so tests need
// not touch the real environment; chorus::init() reads it once.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "chorus/core/device_spec.h"

namespace chorus::runtime {

using Environment = std::map<std::string, std::string>;

// The variables `chorus run` sets for each worker.
namespace env {
constexpr const char* kRank = "CHORUS_RANK";
constexpr const char* kWorldSize = "CHORUS_WORLD_SIZE";
constexpr const char* kLocalRank = "CHORUS_LOCAL_RANK";
constexpr const char* kLocalWorldSize = "CHORUS_LOCAL_WORLD_SIZE";
constexpr const char* kNodeRank = "CHORUS_NODE_RANK";
constexpr const char* kNodes = "CHORUS_NNODES";
constexpr const char* kDevice = "CHORUS_DEVICE";
constexpr const char* kDevices = "CHORUS_DEVICES";  // mpirun/srun: list indexed by local rank
constexpr const char* kStoreEndpoint = "CHORUS_RDZV_ENDPOINT";
// Where the job's store lives: "tcp" (a TcpStoreServer at kStoreEndpoint, the default) or "etcd"
// (kStoreEndpoint names etcd's client endpoints, comma-separated; the job's keys are under
// comm::etcdJobPrefix of its secret).
constexpr const char* kStoreBackend = "CHORUS_RDZV_BACKEND";
constexpr const char* kSecretFd = "CHORUS_SECRET_FD";  // set by `chorus run`
constexpr const char* kSecretFile = "CHORUS_SECRET_FILE";
// No longer read: a secret in the environment is refused with a ConfigError that says why.
constexpr const char* kSecretInEnvironment = "CHORUS_JOB_SECRET";
constexpr const char* kBindAddress = "CHORUS_BIND_ADDRESS";
constexpr const char* kHostId = "CHORUS_HOST_ID";
constexpr const char* kTimeoutMs = "CHORUS_TIMEOUT_MS";
constexpr const char* kCpuTransport = "CHORUS_CPU_TRANSPORT";
constexpr const char* kLogLevel = "CHORUS_LOG_LEVEL";
// Set for a replacement worker of an elastic job: the launch rank whose device and place in the
// launch plan it takes (the lost worker's rank, or, for a replacement of a replacement, the launch
// rank its predecessor took).
constexpr const char* kElasticReplaces = "CHORUS_ELASTIC_REPLACES";
// Set ("1") for a worker that a node joining a running elastic job started (`chorus run --join`):
// its device was not in the launch plan, and the members plan a place for it when they admit it.
constexpr const char* kElasticNewDevice = "CHORUS_ELASTIC_NEW_DEVICE";
// Set ("1") by `chorus run --elastic` for every worker it starts: its agent keeps the others
// running when one fails, so the workers may regroup (the Python front's elastic_steps needs it).
constexpr const char* kElastic = "CHORUS_ELASTIC";
// Where an emulated CPU worker computes within a step (device::staggerOffsets); set by the agent.
constexpr const char* kEmulationOffset = "CHORUS_EMULATION_OFFSET";
// Intra-op threads of a CPU worker (device::intraOpThreads); set by the agent.
constexpr const char* kCpuThreads = "CHORUS_CPU_THREADS";
}  // namespace env

// Value type.
struct WorkerIdentity {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  // Whether the launcher told node_rank (mpirun does not: then host_id is the hostname).
  bool node_known = true;
  int nnodes = 1;
  DeviceSpec device;       // Default: cpu
  std::string store_host;  // empty: no store (a job of one uses an in-process store)
  int store_port = 0;
  // "tcp" (store_host:store_port is a TcpStoreServer) or "etcd" (etcd_endpoints, of which
  // store_host:store_port is the first). Default: "tcp".
  std::string store_backend = "tcp";
  std::vector<std::string> etcd_endpoints;
  int secret_fd = -1;       // an inherited descriptor to read the job secret from (-1: none)
  std::string secret_file;  // set when the secret must be read from a file
  std::string bind_address = "127.0.0.1";
  std::string host_id;     // identifies the host for per-host groups; Default: node rank
  int timeout_ms = 60000;  // default deadline of communication; Default: 60 s
  std::string cpu_transport = "auto";  // CommOptions::cpu_transport; Default: "auto"
  std::string log_level = "info";
  // SpeedEmulator::setStepOffset for an emulated CPU device; Default: 0 (compute, then pad).
  double emulation_offset = 0;
  // Intra-op threads of a CPU worker (device::intraOpThreads). Default: 1; other launchers
  // start one process per core.
  int cpu_threads = 1;
  std::string launcher = "none";  // "chorus", "mpirun", "srun", "torchrun" or "none"
  // A replacement worker of an elastic job (AgentOptions::max_restarts): the launch rank it stands
  // in for (env::kElasticReplaces), < rank; then `rank` is a member id that may be >= world_size
  // (the launch world size). Default: -1 (not a replacement).
  int replaces = -1;
  // A worker of a node that joined the running elastic job (env::kElasticNewDevice): like a
  // replacement its rank is a member id >= world_size, but it stands in for no launch rank.
  // Default: false.
  bool new_device = false;
  // Started by an elastic agent (`chorus run --elastic`, env::kElastic). Default: false.
  bool elastic = false;

  bool hasStore() const { return !store_host.empty(); }
  // Whether this worker joins a running elastic job rather than start with it.
  bool joins() const { return replaces >= 0 || new_device; }
};

// Reads the identity from `environment`. Throws ConfigError naming the variable that is missing
// or malformed (e.g. a rank outside the world size).
WorkerIdentity identityFromEnvironment(const Environment& environment);

// This host's name (gethostname). Throws ConfigError when it cannot be read.
std::string hostName();

// Which launcher started the process, as WorkerIdentity::launcher names it ("chorus", "mpirun",
// "srun", "torchrun" or "none"), without reading or checking the rest of the identity.
std::string launcherOf(const Environment& environment);

// The process's environment as a map: the one reader of `environ` in chorus (call once, at
// start-up, and pass what it returns on).
Environment processEnvironment();

// Splits "host:port" (IPv6 in brackets: "[::1]:29500"); throws ConfigError on a bad endpoint.
std::pair<std::string, int> parseEndpoint(const std::string& endpoint);

}  // namespace chorus::runtime
