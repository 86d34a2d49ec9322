// The node agent behind `chorus run`: starts one worker per device, hands each its identity,
// hosts the job's rendezvous store on node 0 (unless it is in etcd:
// AgentOptions::rdzv_backend), and supervises the workers.
//
// Across nodes the agents meet at the rendezvous endpoint (torchrun style: --nnodes, --node-rank,
// --rdzv-endpoint); node 0's agent hosts the store there. Ranks are numbered node by node, in
// node-rank order. When any worker on any node fails, every agent stops its workers within a few
// seconds and exits non-zero, naming the failed rank; in an elastic job (AgentOptions::elastic)
// the others go on instead, and learn of the loss through the job's store (elasticExitKey).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "chorus/core/device_spec.h"
#include "chorus/device/discovery.h"

namespace chorus::runtime {

// The store key under which node 0's agent puts what AgentOptions::prepare_job returned: for
// `chorus train`, the job and its plan (runtime/job/job_package.h).
inline constexpr const char* kJobPackageKey = "job/package";

struct AgentOptions {
  // Devices of this node, one worker each; `auto` is expanded by the agent. Required.
  std::vector<DeviceSpec> devices;
  // What device::discoverDevices() found on this host, when the caller has it already. Default:
  // empty = the agent discovers them.
  std::vector<device::DeviceInfo> discovered;
  // Node 0: called once every node has joined, with every rank's device and node rank in rank
  // order, before any worker starts; what it returns is put in the job's store under
  // kJobPackageKey (above), where `chorus train` workers read their job and plan. An
  // exception it throws stops the job before it starts. Default: none.
  std::function<std::string(const std::vector<DeviceSpec>& devices,
                            const std::vector<int>& node_of_rank)>
      prepare_job;
  // Number of nodes (agents) in the job. Default: 1.
  int nnodes = 1;
  // This node's index in [0, nnodes). Default: 0.
  int node_rank = 0;
  // HOST:PORT where node 0 hosts the store. Default: "" = 127.0.0.1 on a free port (one node only).
  // With rdzv_backend "etcd": etcd's client endpoints, HOST:PORT[,HOST:PORT...] (required).
  std::string rdzv_endpoint;
  // Where the job's store lives (`--rdzv-backend`, as torchrun names it):
  //  - "tcp": node 0's agent hosts a TcpStoreServer at rdzv_endpoint, authenticated by the job
  //    secret; the job cannot outlive node 0's agent.
  //  - "etcd": every agent and worker is a client of the etcd at rdzv_endpoint (comm::EtcdStore),
  //    under the key prefix of the job's secret (comm::etcdJobPrefix); no agent hosts anything, so
  //    an elastic job survives the loss of node 0 (docs/elastic.md). Agents of launch nodes refuse
  //    (ConfigError) a prefix that holds an earlier job's keys; when every node is done (elastic
  //    jobs: done, or gone as below) the agents delete the prefix. etcd does not check the job
  //    secret: only the job's hosts may reach it.
  // Default: "tcp".
  std::string rdzv_backend = "tcp";
  // File holding the job secret (mode 600). Default: "" = a fresh secret (one node only).
  std::string secret_file;
  // Read the job secret from the first line of standard input instead, and stop the job on this
  // node when standard input ends: how a launcher on another machine starts this agent over ssh
  // (`chorus run -H`, runOnHosts), keeping the secret off every command line and learning of
  // the launcher's end (Ctrl-C, a lost connection) through the closed channel. The end of input
  // is handled as SIGTERM to the agent: workers stop with their grace; before they start, the
  // agent ends at once. Exclusive with secret_file. Default: false.
  bool secret_stdin = false;
  // The worker program and its arguments. Required.
  std::vector<std::string> command;
  // More variables for every worker's environment, for what the caller asks of the workers beyond
  // their identity: `chorus run --metrics-port`'s channel and `--trace`'s file
  // (observe/run_observe.h). The agent's own CHORUS_* identity variables win over a key of the same
  // name. Default: none.
  std::map<std::string, std::string> worker_environment;
  // Directory for one log file per rank. Default: "" (none).
  std::string log_dir;
  // Prefix every output line with "[rank N]". Default: true.
  bool prefix_output = true;
  // Grace between SIGTERM and SIGKILL when stopping workers. Default: 3 s.
  std::chrono::milliseconds grace{3000};
  // How long agents wait for each other at the rendezvous. Default: 5 min.
  std::chrono::milliseconds rdzv_timeout{300000};
  // Default deadline of workers' communication, passed on as CHORUS_TIMEOUT_MS. Default: 60 s.
  std::chrono::milliseconds comm_timeout{60000};
  // CPU transport of the workers' communicators ("auto", "gloo", "shm"), passed on as
  // CHORUS_CPU_TRANSPORT. Default: "auto".
  std::string cpu_transport = "auto";
  // Intra-op threads of the node's CPU workers at full speed (device::intraOpThreads), passed on
  // as CHORUS_CPU_THREADS: 0 shares the cores the other workers leave idle among them. Emulated
  // CPU workers and GPU workers get 1. Default: 0.
  int cpu_threads = 0;
  // Log level passed to workers. Default: "info".
  std::string log_level = "info";
  // glibc malloc settings for the workers (GLIBC_TUNABLES), unless the agent's own environment
  // already sets GLIBC_TUNABLES (the user's choice wins). Default: kRetainFreedMemory. "" leaves
  // malloc as it is.
  std::string malloc_tunables = kRetainFreedMemory;
  // Elastic job: a worker that exits non-zero or is killed by a signal stops no other worker, on
  // this node or another; the survivors detect the lost peer, agree on who is left and go on. As
  // soon as the agent reaps such a worker (SIGCHLD, within milliseconds) it sets
  // elasticExitKey(rank) in the job's store to WorkerExit::describe() and logs "chorus run: lost
  // rank 2 (pid 1234) was killed by signal 9 (SIGKILL): elastic, the others go on"; a worker that
  // exits 0 sets nothing. SIGINT/SIGTERM to the agent still stops every worker. The job on this
  // node ends when all its workers exited; see runAgent() for the exit code. Node 0's agent then
  // keeps the store up, without a deadline, until every node's agent is done or gone: agents beat
  // in the store every second while they supervise, and a node that is not done and has not
  // beaten for 10 s (its agent killed, its link down) is given up. Give every node's
  // agent the same setting. Default: false (the first failure stops every worker of the job).
  bool elastic = false;
  // Elastic jobs: how many times, over the whole run, this node's agent starts a replacement for a
  // worker that failed on its own (exited non-zero or was killed by a signal; not one the agent
  // stopped), like torchrun's --max-restarts. The loss is announced first (elasticExitKey), then
  // the replacement starts with the lost worker's command, environment, device and secret, but a
  // new rank, a member id never used before in the job: world_size + n - 1 for the job's n-th
  // replacement, drawn from kElasticJoinedKey (so it may be >= CHORUS_WORLD_SIZE, which stays the
  // launch world size); CHORUS_RANK is that id and CHORUS_ELASTIC_REPLACES (env::kElasticReplaces)
  // the launch rank it stands in for (the lost worker's, or the one a lost replacement stood in
  // for). Logged as "chorus run: restarting rank 2 as rank 4
  // (restart 1 of 3)"; output prefixes and log files use the new rank. A replacement that fails
  // is lost and replaced in turn while restarts remain. REQUIRES: >= 0, and 0 unless `elastic`.
  // Default: 0 (a lost worker is not replaced).
  int max_restarts = 0;
  // Join a running elastic job as a new node (`chorus run --join`): instead of meeting the other
  // agents at launch, connect to the store at rdzv_endpoint (with the job's secret, secret_file
  // or secret_stdin), take the next node rank (the launch's node count and up), wait until node
  // 0's agent admits the node, and start one worker per device with a new member id (drawn from
  // kElasticJoinedKey, as replacements are) and env::kElasticNewDevice = 1: each asks the job's
  // workers to admit it at a step boundary, with its device, which the launch plan did not have.
  // Its workers take the job's communication deadline and CPU transport from node 0 (comm_timeout
  // and cpu_transport here are not used). The node then works as any elastic node (beats,
  // losses, its own max_restarts). Node 0's agent keeps
  // the store up until joined nodes are done too. Throws ConfigError when the job at the endpoint
  // is not elastic; TimeoutError when node 0 does not admit the node within rdzv_timeout.
  // REQUIRES: elastic, rdzv_endpoint, a secret; nnodes and node_rank are not used. Default: false.
  bool join = false;

  // Keeps freed memory in the process instead of returning it to the OS. By default glibc serves
  // every block over 128 KiB (up to 32 MiB as it adapts) with its own mmap() and gives it back on
  // free(), so each training step page-faults its activations in again: ~15k minor faults per
  // step, a third of a small CNN's compute, and a cost that grows with the batch share, which
  // skews the balancer's per-sample fit (docs/performance.md). This is the CPU counterpart of a
  // GPU caching allocator: memory stays at its peak, which is what the memory budget plans for.
  static constexpr const char* kRetainFreedMemory =
      "glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=4294967296";
};

// The store key that an elastic job's agent sets when rank `rank` is lost (AgentOptions::elastic):
// "elastic/exited/<rank>", e.g. "elastic/exited/2", in the job's store (the one workers reach
// through Worker::store()). Its value is WorkerExit::describe(), e.g. "rank 2 (pid 1234) was killed
// by signal 9 (SIGKILL)" or "rank 2 (pid 1234) exited with code 3".
std::string elasticExitKey(int rank);

// The store counter from which an elastic job's agents draw the member id of each replacement
// worker (AgentOptions::max_restarts) and of each worker of a joining node (AgentOptions::join):
// the job's n-th, on whichever node, gets world_size + n - 1, so member ids are unique across the
// job and never reused.
constexpr const char* kElasticJoinedKey = "elastic/joined";

// Runs the job's part on this node and returns the exit code for `chorus run`: 0 when every
// worker of every node succeeded, 3 when a worker failed, 128 + signal when interrupted (SIGINT or
// SIGTERM). Elastic jobs: 0 when at least one worker of this node exited 0 and every other one
// exited 0 or was lost (the survivors finished the job); 3 when none of this node's workers
// exited 0 (logged as "chorus run: every worker failed; the last: ..."). A worker that was
// replaced (AgentOptions::max_restarts) counts as its last replacement ended. Each node's agent
// decides from its own workers only, so a node whose workers were all lost exits 3 even when
// other nodes' workers finished the job. Throws ConfigError / CommError / LaunchError when the job
// cannot start.
int runAgent(const AgentOptions& options);

}  // namespace chorus::runtime
