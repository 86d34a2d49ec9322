// The discrete-event simulator: runs one training step of a plan task by task and reports what
// happened, as a check on the analytic cost model and as a timeline people can look at.
//
// Every rank executes its forward and backward passes per micro-batch in its schedule's order
// (GPipe, 1F1B, or plain accumulation), waiting for activations and gradients from its neighbour
// stages. Transfers and collective buckets occupy links: a device's intra-node port, a node's
// network; a link carries one transfer at a time, in the order they become ready, so concurrent
// traffic queues (contention). Gradient buckets become ready during each rank's last backward,
// are all-reduced over the stage's data-parallel group in order, then the optimizer steps. Task
// durations come from the cost model, so on a schedule without contention the simulator agrees
// with CostModel::evaluate (tests/plan/simulate/simulator_test.cc pins the cases).
#pragma once

#include <string>
#include <vector>

#include "chorus/plan/cost_model.h"
#include "chorus/plan/plan.h"

namespace chorus::plan {

// One span on the timeline. Value type.
struct TraceSpan {
  std::string name;      // "F3", "B3", "act 0->1 #3", "allreduce s0 b2/4", "optimizer"
  std::string category;  // "compute", "p2p", "allreduce", "optimizer", "allgather" (ZeRO-1/2)
  int rank = 0;          // the rank whose track shows it
  double start = 0;      // seconds from the start of the step
  double duration = 0;
};

struct RankActivity {
  double busy = 0;         // forward + backward + recompute seconds
  double utilization = 0;  // busy / step
  // Idle fraction of the compute phase: 1 - busy / (end of the last compute of any rank).
  double bubble = 0;
  double finish = 0;  // end of the rank's optimizer step (and of ZeRO-1/2's all-gather)
};

struct SimResult {
  double step_seconds = 0;
  // 1 - sum(busy) / (ranks x end of the compute phase): (S-1)/(M+S-1) for a balanced pipeline.
  double bubble_fraction = 0;
  std::vector<RankActivity> ranks;
  std::vector<TraceSpan> spans;  // empty unless SimOptions::trace
  long long tasks = 0;
};

struct SimOptions {
  // Record the timeline. Default: true.
  bool trace = true;
};

// Simulates one step of `plan`. REQUIRES: the plan validates against model.model() and names
// devices of model.cluster() (else ConfigError). Pure function; thread-safe.
SimResult simulate(const CostModel& model, const Plan& plan, const SimOptions& options = {});

// The timeline as Chrome trace-event JSON (open in https://ui.perfetto.dev or chrome://tracing):
// one process per node, one thread per rank for compute and one for its communication.
std::string chromeTrace(const SimResult& result, const Plan& plan, const Cluster& cluster);

}  // namespace chorus::plan
