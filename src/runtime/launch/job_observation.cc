// A job without an agent serves its own metrics and merges its own trace (job_observation.h).
#include "chorus/runtime/launch/job_observation.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "chorus/comm/store/store.h"
#include "chorus/core/error.h"
#include "chorus/core/logging.h"
#include "chorus/observe/metrics_server.h"
#include "launch/output_pump.h"

namespace chorus::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// The job's store keys (one job per store: no prefix beyond the purpose).
std::string hostKey(int rank) { return "observe/host/" + std::to_string(rank); }
std::string nodeKey(const std::string& host_id) { return "observe/node/" + host_id; }
std::string claimKey(const std::string& host_id) { return "observe/first-rank/" + host_id; }
std::string partKey(int member) { return "observe/trace-part/" + std::to_string(member); }

// Prints one line to stdout in a single write (writeAll, as the agent's output pump writes its
// lines): under PYTHONUNBUFFERED, which makes Python's C stdout unbuffered, each `<<` piece would
// be its own write, and the ranks and the launcher that share the terminal or log file would cut
// the line apart. A closed stdout loses the announcement, nothing else.
void announce(const std::string& text) {
  std::cout.flush();
  const std::string line = text + "\n";
  writeAll(STDOUT_FILENO, line.data(), line.size());
}

// This node's index where the launcher names none (mpirun): its place among the hosts of ranks
// 0..rank, ordered by their lowest rank (Communicator::splitByHost's order). Called on the node's
// first rank, which is its lowest.
int nodeIndexFromHosts(comm::Store& store, const WorkerIdentity& identity,
                       std::chrono::milliseconds timeout) {
  std::vector<std::string> hosts;
  for (int rank = 0; rank < identity.rank; ++rank) {
    const std::string host = store.getString(hostKey(rank), timeout);
    if (host == identity.host_id) break;  // not the lowest rank of its host after all
    if (std::find(hosts.begin(), hosts.end(), host) == hosts.end()) hosts.push_back(host);
  }
  return static_cast<int>(hosts.size());
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

bool servedByJob(const Worker& worker, const observe::ObserveRequest& request) {
  return request.any() && worker.identity().launcher != "chorus";
}

JobObservation::JobObservation(std::shared_ptr<Worker> worker, observe::ObserveRequest request)
    : worker_(std::move(worker)), request_(std::move(request)) {
  const WorkerIdentity& identity = worker_->identity();
  const std::chrono::milliseconds timeout(identity.timeout_ms);
  if (!request_.trace.empty()) {
    // Every rank writes its part next to the trace: a path that cannot be written fails now.
    observe::checkTraceWritable(request_.trace);
    if (identity.rank == 0) observe::removeTraceParts(request_.trace);
  }
  const std::shared_ptr<comm::Store> store = identity.world_size > 1 ? worker_->store() : nullptr;
  const bool exchange = store && (request_.metrics_port >= 0 || !identity.node_known);
  if (exchange && !identity.node_known) store->setString(hostKey(identity.rank), identity.host_id);
  request_.node = identity.node_rank;
  if (identity.local_rank == 0) {
    if (exchange) {
      // One first rank per host id: a second node of the same id would leave its ranks reporting
      // to whichever node posted last.
      const std::string mine = std::to_string(identity.rank);
      const std::string claimed = comm::toString(
          store->compareSet(claimKey(identity.host_id), comm::Bytes{}, comm::toBytes(mine)));
      CHORUS_CHECK_CONFIG(claimed == mine, "ranks ", claimed, " and ", identity.rank,
                          " are both the first rank of host id '", identity.host_id,
                          "' (the host name, or CHORUS_HOST_ID): the ranks of a node are told "
                          "apart by it, for ",
                          observe::kMetricsPortVariable, " and ", observe::kTraceVariable,
                          "; give each node its own");
    }
    if (exchange && !identity.node_known)
      request_.node = nodeIndexFromHosts(*store, identity, timeout);
    nlohmann::json posted = {{"node", request_.node}};
    try {
      if (request_.metrics_port >= 0) {
        observe::checkMetricsPort(request_.metrics_port, static_cast<unsigned>(::geteuid()));
        observe::NodeMonitorOptions options;
        options.node = request_.node;
        options.port = request_.metrics_port;
        monitor_ = std::make_unique<observe::NodeMonitor>(options);
        request_.metrics_socket = monitor_->socketPath();
        posted["socket"] = request_.metrics_socket;
        const std::string host = hostName();
        const std::string launcher =
            identity.launcher == "none" ? "no launcher" : identity.launcher;
        const std::string url = "http://" + host + ":" + std::to_string(monitor_->port());
        announce("chorus: metrics of node " + std::to_string(request_.node) + " (" + launcher +
                 ") on " + url + "/metrics, live page on " + url + "/");
      }
    } catch (const ConfigError& error) {
      // The node's other ranks would wait for a socket that never comes: they get the refusal.
      // (The server's message names --metrics-port, the agent's option for the same port.)
      const std::string refusal = std::string(observe::kMetricsPortVariable) + "=" +
                                  std::to_string(request_.metrics_port) + " on " + hostName() +
                                  ": " + error.message();
      posted["error"] = refusal;
      if (exchange) store->setString(nodeKey(identity.host_id), posted.dump());
      CHORUS_THROW(ConfigError, refusal);
    }
    if (exchange) store->setString(nodeKey(identity.host_id), posted.dump());
  } else if (exchange) {
    const auto posted = nlohmann::json::parse(store->getString(nodeKey(identity.host_id), timeout));
    if (posted.contains("error"))
      CHORUS_THROW(
          ConfigError, "the metrics of this node (", identity.host_id,
          ") are not served: its first rank refused them: ", posted.at("error").get<std::string>());
    request_.node = posted.at("node").get<int>();
    if (posted.contains("socket")) request_.metrics_socket = posted.at("socket").get<std::string>();
  }
}

JobObservation::~JobObservation() = default;

int JobObservation::finish() {
  if (finished_ || request_.trace.empty()) return 0;
  finished_ = true;
  const WorkerIdentity& identity = worker_->identity();
  const int member = worker_->member();
  const std::shared_ptr<comm::Store> store = identity.world_size > 1 ? worker_->store() : nullptr;
  if (identity.rank != 0) {
    if (!store) return 0;
    // Read and removed before it is handed over: rank 0 writes it again, on its own file system
    // (the same one, or not), and merges it.
    const std::string part = observe::tracePartPath(request_.trace, member);
    const std::string text = readFile(part);
    std::remove(part.c_str());
    try {
      store->setString(partKey(member), text);
    } catch (const Error& error) {
      logWarn("trace: could not hand this rank's part of ", request_.trace,
              " to rank 0 (the timeline lacks it): ", error.what());
    }
    return 0;
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(identity.timeout_ms);
  std::vector<int> missing;
  for (int other = 1; store && other < identity.world_size; ++other) {
    const auto left =
        std::max(std::chrono::milliseconds(1),
                 std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    try {
      const std::string text = store->getString(partKey(other), left);
      if (text.empty()) continue;  // that rank recorded no step
      std::ofstream out(observe::tracePartPath(request_.trace, other), std::ios::binary);
      out << text;
      if (!out.flush())
        CHORUS_THROW(ConfigError, "trace: cannot write rank ", other, "'s part next to ",
                     request_.trace);
    } catch (const TimeoutError&) {
      missing.push_back(other);
    }
  }
  if (!missing.empty()) {
    std::ostringstream ranks;
    for (size_t i = 0; i < missing.size(); ++i) ranks << (i ? ", " : "") << missing[i];
    logWarn("trace: no part from rank(s) ", ranks.str(), " within the job's deadline (",
            identity.timeout_ms, " ms): ", request_.trace, " lacks them");
  }
  const int merged = observe::mergeTraceOf(request_.trace);
  if (merged > 0)
    announce("chorus: wrote the timeline of " + std::to_string(merged) + " ranks to " +
             request_.trace);
  else
    announce("chorus: no rank recorded a step for " + request_.trace +
             " (the timeline comes from chorus.DataParallel and chorus.step)");
  return merged;
}

}  // namespace chorus::runtime
