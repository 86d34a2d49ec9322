#include "chorus/runtime/launch/agent.h"

#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <limits>
#include <map>
#include <set>
#include <thread>

#include "chorus/comm/store/etcd_store.h"
#include "chorus/comm/store/job_secret.h"
#include "chorus/comm/store/tcp_store.h"
#include "chorus/core/error.h"
#include "chorus/core/logging.h"
#include "chorus/device/discovery.h"
#include "chorus/runtime/launch/identity.h"
#include "chorus/runtime/launch/supervisor.h"
#include "launch/child_process.h"
#include "launch/elastic_losses.h"
#include "launch/node_rendezvous.h"
#include "launch/worker_launches.h"

namespace chorus::runtime {
namespace {

void validateOptions(const AgentOptions& options) {
  CHORUS_CHECK_CONFIG(!options.command.empty(), "chorus run: no worker program given after --");
  CHORUS_CHECK_CONFIG(options.nnodes >= 1, "chorus run: --nnodes must be at least 1");
  CHORUS_CHECK_CONFIG(options.node_rank >= 0 && options.node_rank < options.nnodes,
                      "chorus run: --node-rank ", options.node_rank, " is outside [0, ",
                      options.nnodes, ")");
  // Workers read the deadline back as an int of milliseconds, and 0 would expire at once.
  CHORUS_CHECK_CONFIG(options.comm_timeout.count() >= 1 &&
                          options.comm_timeout.count() <= std::numeric_limits<int>::max(),
                      "chorus run: the communication deadline must be 1 ms to 24 days, got ",
                      options.comm_timeout.count(), " ms");
  CHORUS_CHECK_CONFIG(options.grace.count() >= 0,
                      "chorus run: the grace before SIGKILL must not be negative");
  CHORUS_CHECK_CONFIG(options.max_restarts >= 0, "chorus run: --max-restarts must not be negative");
  CHORUS_CHECK_CONFIG(options.max_restarts == 0 || options.elastic,
                      "chorus run: --max-restarts needs --elastic (without it the first failure "
                      "stops every worker)");
  CHORUS_CHECK_CONFIG(options.rdzv_backend == "tcp" || options.rdzv_backend == "etcd",
                      "chorus run: --rdzv-backend '", options.rdzv_backend,
                      "' is not tcp (node 0's agent hosts the store) or etcd");
  if (options.rdzv_backend == "etcd") {
    CHORUS_CHECK_CONFIG(!options.rdzv_endpoint.empty(),
                        "chorus run: --rdzv-backend etcd needs --rdzv-endpoint HOST:PORT, where "
                        "etcd serves clients (e.g. 10.0.0.5:2379; several, comma-separated)");
    comm::parseEtcdEndpoints(options.rdzv_endpoint);
  }
  CHORUS_CHECK_CONFIG(!options.secret_stdin || options.secret_file.empty(),
                      "chorus run: --secret-stdin and --secret-file both name the job secret; give "
                      "one");
  if (options.join) {
    CHORUS_CHECK_CONFIG(options.elastic,
                        "chorus run: --join needs --elastic: only an elastic job takes new nodes");
    CHORUS_CHECK_CONFIG(options.nnodes == 1 && options.node_rank == 0,
                        "chorus run: --join takes this node's rank from the running job; do not "
                        "give --nnodes or --node-rank");
    CHORUS_CHECK_CONFIG(!options.rdzv_endpoint.empty(),
                        "chorus run: --join needs --rdzv-endpoint HOST:PORT, where the job's store "
                        "is (node 0's agent logs it)");
    CHORUS_CHECK_CONFIG(!options.secret_file.empty() || options.secret_stdin,
                        "chorus run: --join needs the job's secret (--secret-file, or "
                        "--secret-stdin); a job started without --secret-file has a secret no "
                        "other node knows");
  }
  if (options.nnodes > 1) {
    CHORUS_CHECK_CONFIG(!options.rdzv_endpoint.empty(),
                        "chorus run: a job of several nodes needs --rdzv-endpoint HOST:PORT");
    CHORUS_CHECK_CONFIG(!options.secret_file.empty() || options.secret_stdin,
                        "chorus run: a job of several nodes needs --secret-file, the same file "
                        "(mode 600) on every node");
  }
}

// AgentOptions::secret_stdin: the first line of standard input, read a byte at a time so that
// nothing after it is consumed here.
comm::JobSecret readSecretLine() {
  std::string line;
  for (;;) {
    char c = 0;
    const ssize_t n = ::read(STDIN_FILENO, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || c == '\n') break;
    line.push_back(c);
    CHORUS_CHECK_CONFIG(line.size() <= comm::JobSecret::kMaxLength,
                        "chorus run: --secret-stdin: the first line of standard input is longer "
                        "than a job secret may be");
  }
  return comm::JobSecret::fromText(line);
}

// AgentOptions::secret_stdin: the launcher keeps our standard input open while the job runs; its
// end means the launcher or its connection is gone. A detached thread, because a read of a pipe or
// socket has no deadline; SIGTERM to ourselves, because that is already how the agent stops.
void stopWhenStdinEnds() {
  std::thread([] {
    char buffer[256];
    for (;;) {
      const ssize_t n = ::read(STDIN_FILENO, buffer, sizeof buffer);
      if (n > 0 || (n < 0 && errno == EINTR)) continue;
      break;
    }
    logWarn("chorus run: standard input ended: the launcher is gone; stopping this node");
    ::kill(::getpid(), SIGTERM);
  }).detach();
}

comm::JobSecret jobSecret(const AgentOptions& options) {
  if (options.secret_stdin) {
    comm::JobSecret secret = readSecretLine();
    stopWhenStdinEnds();
    return secret;
  }
  return options.secret_file.empty() ? comm::JobSecret::generate()
                                     : comm::JobSecret::fromFile(options.secret_file);
}

// The job's store: hosted here on node 0, reached as a client everywhere; or in etcd, where every
// agent and worker is a client.
struct StoreConnection {
  std::unique_ptr<comm::TcpStoreServer> server;
  std::shared_ptr<comm::Store> client;
  std::string endpoint;  // what workers connect to
  bool etcd = false;
};

// The store server's connection limit: each worker's and each agent's connections, and room for
// replacements (a lost worker's sockets close when it dies, but its replacement may connect first).
int storeConnectionLimit(int workers, int agents, long long replacements) {
  const long long limit =
      kConnectionsPerWorker * (workers + replacements) + agents + comm::kStoreConnectionMargin;
  return static_cast<int>(std::min<long long>(limit, std::numeric_limits<int>::max()));
}

StoreConnection connectStore(const AgentOptions& options, const comm::JobSecret& secret,
                             int local_workers) {
  StoreConnection connection;
  if (options.rdzv_backend == "etcd") {
    comm::EtcdStoreOptions client;
    client.endpoints = comm::parseEtcdEndpoints(options.rdzv_endpoint);
    client.prefix = comm::etcdJobPrefix(secret);
    client.connect_timeout = options.rdzv_timeout;
    connection.client = std::make_shared<comm::EtcdStore>(client);
    connection.endpoint = options.rdzv_endpoint;
    connection.etcd = true;
    return connection;
  }
  std::string host = "127.0.0.1";
  int port = 0;
  if (!options.rdzv_endpoint.empty()) std::tie(host, port) = parseEndpoint(options.rdzv_endpoint);
  if (options.node_rank == 0 && !options.join) {
    comm::TcpStoreServerOptions server;
    server.host = options.nnodes > 1 ? "0.0.0.0" : host;
    server.port = port;
    server.secret = secret;
    // One connection per worker and per agent. With several nodes the job's size is known only
    // once the agents met (runAgent tightens the limit then); until then no worker exists.
    if (options.nnodes == 1)
      server.max_connections = storeConnectionLimit(local_workers, 1, options.max_restarts);
    connection.server = std::make_unique<comm::TcpStoreServer>(server);
    port = connection.server->port();
  }
  comm::TcpStoreOptions client;
  client.host = host;
  client.port = port;
  client.secret = secret;
  client.connect_timeout = options.rdzv_timeout;
  connection.client = std::make_shared<comm::TcpStore>(client);
  connection.endpoint = host + ":" + std::to_string(port);
  return connection;
}

// The exit code of an elastic job's node once all its workers ended on their own (runAgent): each
// local worker counts by its last life, the last replacement of a lost one.
int elasticResult(const SupervisorOutcome& outcome, const std::set<int>& replaced) {
  std::vector<WorkerExit> last_lives;
  for (const WorkerExit& exit : outcome.exits)
    if (replaced.count(exit.rank) == 0) last_lives.push_back(exit);
  const std::size_t workers = last_lives.size();
  const auto succeeded = static_cast<std::size_t>(std::count_if(
      last_lives.begin(), last_lives.end(), [](const WorkerExit& exit) { return exit.success(); }));
  if (succeeded == workers) return 0;
  if (succeeded > 0) {
    logInfo("chorus run: ", workers - succeeded, " of ", workers,
            " workers on this node were lost; the others finished");
    return 0;
  }
  logError("chorus run: every worker failed; the last: ", last_lives.back().describe());
  return 3;
}

int report(const AgentOptions& options, const SupervisorOutcome& outcome, comm::Store& store,
           const std::set<int>& replaced) {
  if (outcome.first_failure && !options.elastic) {
    const std::string message =
        detail::concat(outcome.first_failure->describe(), " on node ", options.node_rank);
    try {
      reportJobFailure(store, message);
    } catch (const std::exception&) {
    }
    logError("chorus run: ", message, "; stopped the other workers");
    return 3;
  }
  if (!outcome.external_failure.empty()) {
    logError("chorus run: stopped: ", outcome.external_failure);
    return 3;
  }
  if (outcome.interrupt_signal != 0) {
    logWarn("chorus run: interrupted by signal ", outcome.interrupt_signal, "; workers stopped");
    return 128 + outcome.interrupt_signal;
  }
  return options.elastic ? elasticResult(outcome, replaced) : 0;
}

// Node 0 hands the job to every worker; a job that cannot be prepared stops the other nodes too.
void publishJob(const AgentOptions& options, const NodeSlot& slot, comm::Store& store) {
  try {
    store.setString(kJobPackageKey, options.prepare_job(slot.devices, slot.node_of_rank));
  } catch (const std::exception& error) {
    if (options.nnodes > 1) reportJobFailure(store, error.what());
    throw;
  }
}

// rdzv_backend etcd: the key under which the agent that deletes the job's keys claims it.
constexpr const char* kCleanupKey = "agents/cleanup";

// rdzv_backend etcd: a launch node meets the others under the key prefix of the job's secret, so a
// job that ran before with the same secret and was not cleaned up (its node 0 killed, say) would
// hand this one its state. Its package is there only once every launch node of that job met, and
// this job's node 0 writes it only after this node met the others: so it can only be an older
// job's (or one still running).
void refuseStaleEtcdJob(comm::Store& store, const AgentOptions& options) {
  if (!store.check({kJobPackageKey})) return;
  const auto& etcd = static_cast<const comm::EtcdStore&>(store);
  CHORUS_THROW(ConfigError, "chorus run: etcd at ", options.rdzv_endpoint,
               " holds the keys of a job with the same secret (running, or ended without "
               "cleaning up, e.g. after losing nodes) under ",
               etcd.options().prefix,
               "; start the new job with another secret, or delete them: "
               "etcdctl --endpoints ",
               options.rdzv_endpoint, " del --prefix ", etcd.options().prefix);
}

// rdzv_backend etcd: no agent keeps the store up, but the job's keys must not outlive the job.
// In an elastic job every agent waits, as node 0's does for a TCP store, until every node is done
// or gone (it admits joining nodes meanwhile), and the first to claim the clean-up deletes the
// prefix; in a job that is not elastic node 0 waits until every node is done. `launch_nodes`:
// the launch's node count (joined nodes are counted from the store).
void finishEtcdJob(const AgentOptions& options, comm::Store& store, int launch_nodes,
                   const std::function<void()>& admit) {
  if (options.elastic) {
    if (launch_nodes > 1 || options.join)
      logInfo("chorus run: waiting until every node's workers are done, to delete the job's keys");
    awaitNodesDoneOrGone(store, launch_nodes, kNodeLease, admit);
  } else if (options.node_rank == 0) {
    awaitNodesDone(store, launch_nodes, options.rdzv_timeout);
  } else {
    return;
  }
  auto& etcd = static_cast<comm::EtcdStore&>(store);
  const std::string me = "node " + std::to_string(options.node_rank);
  if (comm::toString(etcd.compareSet(kCleanupKey, {}, comm::toBytes(me))) != me) return;
  const std::int64_t deleted = etcd.deleteAll();
  logInfo("chorus run: every node is done or gone: deleted the job's ", deleted,
          " keys from etcd (", etcd.options().prefix, ")");
}

}  // namespace

std::string elasticExitKey(int rank) { return "elastic/exited/" + std::to_string(rank); }

namespace {

// Starts this node's workers and supervises them to the end; returns runAgent's exit code.
// `options.node_rank` is this node's (a joining node's own), `world_size` the launch world size,
// `launch_nodes` the launch's node count, and `admit` the admission of joining nodes (node 0's;
// every agent's with etcd), run with every supervision check (else empty).
int supervise(const AgentOptions& options, const std::vector<WorkerLaunch>& launches,
              StoreConnection& store, int world_size, int launch_nodes,
              const std::function<void()>& admit) {
  SupervisorOptions supervision;
  supervision.prefix_output = options.prefix_output;
  supervision.log_dir = options.log_dir;
  supervision.grace = options.grace;
  ElasticLosses losses(*store.client, world_size, options.max_restarts);
  if (options.elastic) {
    supervision.stop_on_failure = false;
    supervision.on_exit = [&losses](const WorkerExit& exit) { losses.onExit(exit); };
  }
  Supervisor supervisor(supervision);
  losses.attach(supervisor, launches);
  supervisor.start(launches);
  std::function<std::optional<std::string>()> remote_failure;
  Clock::time_point last_beat{};
  if (options.nnodes > 1 || options.elastic)
    remote_failure = [&]() -> std::optional<std::string> {
      if (options.elastic) beatNode(*store.client, options.node_rank, last_beat);
      if (admit) admit();
      // Only a job of several nodes posts a failure there (elastic nodes never do).
      return options.nnodes > 1 ? jobFailure(*store.client) : std::nullopt;
    };
  const SupervisorOutcome outcome = supervisor.run(remote_failure);
  const int code = report(options, outcome, *store.client, losses.replaced());
  reportNodeDone(*store.client, options.node_rank);
  if (store.etcd) {
    finishEtcdJob(options, *store.client, launch_nodes, admit);
  } else if (store.server && options.elastic) {
    // The other nodes' survivors (and nodes that joined) may go on for days and still need the
    // store, but a node whose agent no longer beats (killed, cut off) will never say it is done.
    if (options.nnodes > 1)
      logInfo("chorus run: keeping the job's store up until every node's workers are done");
    awaitNodesDoneOrGone(*store.client, options.nnodes, kNodeLease, admit);
  } else if (store.server && options.nnodes > 1) {
    awaitNodesDone(*store.client, options.nnodes, options.rdzv_timeout);
  }
  return code;
}

// AgentOptions::join: this node joins the running elastic job at options.rdzv_endpoint.
int runJoiningNode(const AgentOptions& options, const std::vector<DeviceSpec>& devices, int cores,
                   const comm::JobSecret& secret) {
  StoreConnection store = connectStore(options, secret, static_cast<int>(devices.size()));
  const LaunchInfo launch = launchInfo(*store.client, options.rdzv_endpoint);
  AgentOptions node = options;
  node.node_rank = announceJoiningNode(*store.client, launch, devices, options.max_restarts);
  node.nnodes = node.node_rank + 1;
  node.comm_timeout = launch.comm_timeout;
  node.cpu_transport = launch.cpu_transport;
  logInfo("chorus run: node ", node.node_rank, " asks to join the running job at ", store.endpoint,
          " (", launch.world_size, " launch ranks on ", launch.nnodes, " nodes) with ",
          toString(devices));
  awaitNodeAdmitted(*store.client, node.node_rank, options.rdzv_timeout);
  NodeSlot slot;
  slot.world_size = launch.world_size;
  std::vector<WorkerLaunch> launches =
      describeWorkers(node, devices, cores, slot, store.endpoint, secret);
  std::vector<int> ranks;
  for (WorkerLaunch& worker : launches) {
    worker.rank = drawMemberId(*store.client, launch.world_size);
    worker.env[env::kRank] = std::to_string(worker.rank);
    worker.env[env::kElasticNewDevice] = "1";
    ranks.push_back(worker.rank);
  }
  logInfo("chorus run: node ", node.node_rank, " admitted: ranks ", joinInts(ranks), " on ",
          toString(devices), " ask the job's workers to take them in");
  // With etcd a joined node admits later ones too: node 0 may be gone.
  std::function<void()> admit;
  if (store.etcd) admit = [&] { admitJoiningNodes(*store.client, launch, [](int) {}); };
  return supervise(node, launches, store, launch.world_size, launch.nnodes, admit);
}

}  // namespace

int runAgent(const AgentOptions& options) {
  validateOptions(options);
  const auto found = options.discovered.empty() ? device::discoverDevices() : options.discovered;
  const std::vector<DeviceSpec> devices = device::expandAuto(options.devices, found);
  device::validateSpecs(devices, found);
  const comm::JobSecret secret = jobSecret(options);
  if (options.join) return runJoiningNode(options, devices, found.front().cores, secret);
  StoreConnection store = connectStore(options, secret, static_cast<int>(devices.size()));
  if (store.etcd) refuseStaleEtcdJob(*store.client, options);
  const NodeSlot slot =
      joinNodes(*store.client, options.node_rank, options.nnodes, devices, options.rdzv_timeout);
  int store_limit = 0;
  if (store.server) {
    store_limit =
        storeConnectionLimit(slot.world_size, options.nnodes,
                             static_cast<long long>(options.nnodes) * options.max_restarts);
    store.server->setMaxConnections(store_limit);
  }
  if (options.prepare_job && options.node_rank == 0) publishJob(options, slot, *store.client);
  logInfo("chorus run: node ", options.node_rank, "/", options.nnodes, ": ranks ", slot.rank_offset,
          "..", slot.rank_offset + static_cast<int>(devices.size()) - 1, " of ", slot.world_size,
          " on ", toString(devices), ", store ", store.etcd ? "in etcd at " : "", store.endpoint);
  // Node 0 of an elastic job takes in nodes that join later (`chorus run --join`), making room
  // for their connections in the store first.
  std::function<void()> admit;
  const LaunchInfo launch{slot.world_size, options.nnodes, options.comm_timeout,
                          options.cpu_transport};
  // In etcd every agent admits them (node 0 may be gone); the store needs no room made.
  if (store.server && options.elastic) {
    publishLaunchInfo(*store.client, launch);
    admit = [&] {
      admitJoiningNodes(*store.client, launch, [&](int connections) {
        store_limit += connections;
        store.server->setMaxConnections(store_limit);
      });
    };
  } else if (store.etcd && options.elastic) {
    if (options.node_rank == 0) publishLaunchInfo(*store.client, launch);
    admit = [&] { admitJoiningNodes(*store.client, launch, [](int) {}); };
  }
  const std::vector<WorkerLaunch> launches =
      describeWorkers(options, devices, found.front().cores, slot, store.endpoint, secret);
  return supervise(options, launches, store, slot.world_size, options.nnodes, admit);
}

}  // namespace chorus::runtime
