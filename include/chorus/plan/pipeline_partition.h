// Uneven pipeline cuts: where to cut a model's layers into S stages that run on unlike devices.
//
// A pipeline with M micro-batches and per-micro-batch stage times t_s takes
//   sum_s t_s + (M - 1) * max_s t_s
// and its data-parallel synchronization adds max_s e_s (each stage's exposed all-reduce and
// optimizer step). partitionLayers() minimizes the sum of the three terms exactly: it enumerates
// the bottleneck cap c over the distinct stage times in ascending order (as Alpa's stage DP does)
// and for each cap runs a dynamic program over (stage, first layer) whose states keep the Pareto
// front of (sum of t, max of e). It stops once (M - 1) * c plus a lower bound of the rest exceeds
// the best plan found. Stage costs come from a callback, so the search is independent of how they
// are priced (the planner passes the cost model's; tests pass random tables).
#pragma once

#include <functional>
#include <optional>
#include <vector>

namespace chorus::plan {

// Cost of running layers [first, last) as stage `stage`. Value type.
struct StageCost {
  bool feasible = false;
  // Seconds per micro-batch, transfers included (t_s).
  double time = 0;
  // Exposed synchronization and optimizer after the last micro-batch (e_s).
  double tail = 0;
  // A part of `time` that never decreases as `last` grows (compute), used to stop scanning.
  double monotone = 0;
  // Free for the caller (the planner stores whether the stage checkpoints activations).
  int tag = 0;
};

// REQUIRES of the callback: cost(s, i, j).monotone <= cost(s, i, j + 1).monotone, and a stage that
// is infeasible stays infeasible when it takes more layers.
using StageCostFn = std::function<StageCost(int stage, int first, int last)>;

// A partition: cuts[0] = 0 < cuts[1] < ... < cuts[S] = layers; stage s runs [cuts[s], cuts[s+1]).
struct Partition {
  std::vector<int> cuts;
  std::vector<int> tags;
  double objective = 0;  // sum + (M - 1) * slowest + tail
  double sum = 0;
  double slowest = 0;
  double tail = 0;
};

struct PartitionOptions {
  // A lower bound on sum_s t_s + max_s e_s of any partition, for the stopping rule. Default: 0.
  double lower_bound = 0;
  // Partitions at or above this objective are not wanted (nullopt is returned when none is below).
  // Default: infinity.
  double upper_bound = 1e300;
};

// The partition of `layers` layers into `stages` non-empty stages minimizing the objective, or
// nullopt when no partition is feasible (or none beats options.upper_bound). Ties go to the
// smallest sum, then the earliest cuts. REQUIRES: 1 <= stages <= layers, micro_batches >= 1.
std::optional<Partition> partitionLayers(int layers, int stages, int micro_batches,
                                         const StageCostFn& cost,
                                         const PartitionOptions& options = {});

// The same answer by enumerating every partition: for tests, and small inputs only.
std::optional<Partition> partitionLayersBruteForce(int layers, int stages, int micro_batches,
                                                   const StageCostFn& cost);

}  // namespace chorus::plan
