// `chorus run --metrics-port` and `--trace` for a user's program: how the agent asks its workers
// for the figures `chorus train`'s workers send, and how it merges their timelines afterwards.
//
// The agent serves the metrics (node_monitor.h) and tells each worker, through its environment,
// the node-local socket to report to and the trace to record; a worker reads these once, at
// start-up (the Python front: chorus.init), and sends the same RankReport (rank_report.h) and
// writes the same trace part (trace_recorder.h) as a `chorus train` worker, so that both kinds of
// job have the same series and the same timeline. Only an agent of chorus's serves the metrics and
// merges the parts: a process that another launcher started (mpirun, srun, torchrun) and that
// finds these variables refuses them (ConfigError) rather than report to no one.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "chorus/observe/trace_recorder.h"

namespace chorus::observe {

// The variables `chorus run` sets in its workers' environment.
inline constexpr const char* kMetricsSocketVariable = "CHORUS_METRICS_SOCKET";
inline constexpr const char* kTraceVariable = "CHORUS_TRACE";
inline constexpr const char* kTraceStepsVariable = "CHORUS_TRACE_STEPS";

// What a worker is asked to observe. Value type. Default: nothing.
struct ObserveRequest {
  std::string metrics_socket;  // the agent's channel (metrics_channel.h); "": no reports
  std::string trace;           // the merged trace's path; each rank writes tracePartPath(trace, r)
  TraceSteps trace_steps;      // the steps the trace records

  bool any() const { return !metrics_socket.empty() || !trace.empty(); }
};

// The variables that carry `request` to a worker (none for what it does not ask).
std::map<std::string, std::string> observeEnvironment(const ObserveRequest& request);

// Reads them back from a worker's environment. `launcher`: who started the process
// (runtime::launcherOf: "chorus", "mpirun", ...). Throws ConfigError when they are set but the
// process was not started by chorus's agent (no agent serves those metrics or merges that trace:
// the variables were copied in by hand), or when the trace's steps are malformed.
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
