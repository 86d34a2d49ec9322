// `chorus run --metrics-port` and `--trace` for a user's program: how the agent asks its workers
// for the figures `chorus train`'s workers send, and how it merges their timelines afterwards;
// and the same request made by the user for a job that another launcher started.
//
// The agent serves the metrics (node_monitor.h) and tells each worker, through its environment,
// the node-local socket to report to and the trace to record; a worker reads these once, at
// start-up (the Python front: chorus.init), and sends the same RankReport (rank_report.h) and
// writes the same trace part (trace_recorder.h) as a `chorus train` worker, so that both kinds of
// job have the same series and the same timeline.
//
// A process that mpirun, srun or torchrun started (or one started by hand) has no agent: there the
// user sets CHORUS_METRICS_PORT and CHORUS_TRACE (CHORUS_TRACE_STEPS) for every rank, and the
// job's own ranks do the agent's work (runtime/launch/job_observation.h): each node's first rank
// serves its node's metrics, rank 0 merges the trace. The agent's socket variable is refused there
// (ConfigError: it names a private socket of an agent that does not exist), and so is
// CHORUS_METRICS_PORT under `chorus run`, whose agent serves the metrics (--metrics-port).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "chorus/observe/trace_recorder.h"

namespace chorus::observe {

// The variables `chorus run` sets in its workers' environment. The user sets the last two for a
// job that another launcher started.
inline constexpr const char* kMetricsSocketVariable = "CHORUS_METRICS_SOCKET";
inline constexpr const char* kTraceVariable = "CHORUS_TRACE";
inline constexpr const char* kTraceStepsVariable = "CHORUS_TRACE_STEPS";
// Set by the user for a job without an agent (mpirun, srun, torchrun, by hand): the port each
// node's first rank serves its node's metrics on (0: a free one, printed).
inline constexpr const char* kMetricsPortVariable = "CHORUS_METRICS_PORT";

// What a worker is asked to observe. Value type. Default: nothing.
struct ObserveRequest {
  std::string metrics_socket;  // the agent's channel (metrics_channel.h); "": no reports
  std::string trace;           // the merged trace's path; each rank writes tracePartPath(trace, r)
  TraceSteps trace_steps;      // the steps the trace records
  // Without an agent (kMetricsPortVariable): the port the node's first rank serves on; -1: none.
  int metrics_port = -1;
  // The node index that reports and the trace name; -1: the worker identity's node rank. Set by
  // the ranks of a job without an agent where the launcher tells no node index (mpirun).
  int node = -1;

  bool any() const { return !metrics_socket.empty() || !trace.empty() || metrics_port >= 0; }
};

// The variables that carry `request` to a worker (none for what it does not ask).
std::map<std::string, std::string> observeEnvironment(const ObserveRequest& request);

// Reads them back from a worker's environment. `launcher`: who started the process
// (runtime::launcherOf: "chorus", "mpirun", ...). Under "chorus" the agent's variables are taken
// and kMetricsPortVariable is refused (the agent serves the metrics: `chorus run --metrics-port`);
// under any other launcher kMetricsPortVariable and the trace are taken (the job serves and merges
// them itself) and the agent's socket is refused (no agent: the variable was copied in by hand).
// Throws ConfigError for those refusals, a port that is not 0..65535, steps without a trace, or
// malformed steps.
ObserveRequest observeRequestFromEnvironment(const std::map<std::string, std::string>& environment,
                                             const std::string& launcher);

// The parts of `trace` that workers wrote (<trace>.rank<N> in its folder), sorted.
std::vector<std::string> traceParts(const std::string& trace);
// Removes the parts an earlier run left, so that they are not merged into this run's timeline.
void removeTraceParts(const std::string& trace);
// Merges the parts into `trace` (mergeTraceParts) and removes them. Returns the number of ranks
// merged; 0 when no worker wrote a part (then nothing is written).
int mergeTraceOf(const std::string& trace);

}  // namespace chorus::observe
