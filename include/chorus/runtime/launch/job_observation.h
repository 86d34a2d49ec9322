// Metrics and a timeline for a job that no chorus agent started (mpirun, srun, torchrun, or a
// process started by hand): the job's own ranks do what `chorus run --metrics-port/--trace`'s
// agent does (observe/run_observe.h), with the agent's code.
//
// The user asks for it through CHORUS_METRICS_PORT and CHORUS_TRACE (CHORUS_TRACE_STEPS), set for
// every rank (`mpirun -x`, srun's exported environment) and read once at start-up. Then:
//  - metrics: the first rank of each node (local rank 0) runs the node's observe::NodeMonitor on
//    that port, the same /metrics, live page and /api/state as the agent's, and posts its
//    node-local socket in the job's store; every rank of the node, the first included, sends its
//    step reports there (as a `chorus run` worker does). The monitor lives as long as that rank's
//    process: a scrape after it exited finds nothing, unlike an agent that outlives its workers.
//  - trace: every rank writes its part as under `chorus run`; at its end (finish()) it hands the
//    part to rank 0 through the job's store, and rank 0 merges all parts into the trace
//    (observe::mergeTraceOf), on its own file system, so that no shared file system is needed.
// Nodes are told apart by WorkerIdentity::host_id; where the launcher names no node index
// (mpirun), a node's index is its place among the hosts ordered by their lowest rank.
#pragma once

#include <memory>

#include "chorus/observe/node_monitor.h"
#include "chorus/observe/run_observe.h"
#include "chorus/runtime/launch/worker.h"

namespace chorus::runtime {

// Whether `request` is one that the job's own ranks serve (JobObservation): something is asked
// and no chorus agent started the worker.
bool servedByJob(const Worker& worker, const observe::ObserveRequest& request);

// One per rank, for the process's life. Non-copyable; one thread at a time.
class JobObservation {
 public:
  // Collective over the job's store: every rank makes one after init(), before its first step.
  // On a node's first rank it listens on request.metrics_port; rank 0 removes an earlier run's
  // trace parts. Throws ConfigError when the port cannot be used (on every rank of that node: the
  // first one posts the refusal), the trace cannot be written, or a second rank claims to be the
  // first of a host id (two nodes of one name); TimeoutError when the node's first rank posts
  // nothing within the job's deadline.
  JobObservation(std::shared_ptr<Worker> worker, observe::ObserveRequest request);
  ~JobObservation();
  JobObservation(const JobObservation&) = delete;
  JobObservation& operator=(const JobObservation&) = delete;

  // What this rank's step observer is to do: report to the node's socket (metrics_socket), record
  // into its part of `trace`, naming node `node`.
  const observe::ObserveRequest& request() const { return request_; }
  // The node's monitor on the node's first rank (when metrics were asked); null elsewhere.
  const observe::NodeMonitor* monitor() const { return monitor_.get(); }

  // At the rank's end, after its trace part is written (or not: a rank that recorded nothing
  // hands over nothing): hands the part to rank 0, which waits for every rank's (at most the
  // job's deadline in all), merges them into the trace and says so on standard output. Returns
  // the number of ranks merged on rank 0, 0 elsewhere and without a trace. Later calls do nothing.
  int finish();

 private:
  std::shared_ptr<Worker> worker_;
  observe::ObserveRequest request_;
  std::unique_ptr<observe::NodeMonitor> monitor_;
  bool finished_ = false;
};

}  // namespace chorus::runtime
