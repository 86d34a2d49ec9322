// The planner's search space, shared by the pruned search (planner.cc) and the exhaustive
// enumeration (exhaustive_search.cc) so that both walk exactly the same configurations.
#pragma once

#include <string>
#include <vector>

#include "chorus/plan/cost_model.h"
#include "chorus/plan/planner.h"

namespace chorus::plan::detail {

// The devices a plan may use: every device of the fastest `type_ids.size()` types.
struct DeviceSubset {
  std::vector<int> devices;   // cluster device ids, in cluster order
  std::vector<int> type_ids;  // kept cluster type ids, fastest first
  std::vector<int> dropped;   // left-out type ids
};

// All devices, then (when allowed) without the slowest type, without the two slowest, ...
std::vector<DeviceSubset> deviceSubsets(const CostModel& model, const PlanOptions& options);

// All-reduce algorithms and codecs worth trying for groups that do (or do not) cross nodes.
std::vector<CommPlan> commChoices(bool crosses_nodes, const PlanOptions& options);

// R identical replicas of S stages: devices[r][s] is a cluster device id; every replica has the
// same device type at every stage.
struct PipelineShape {
  std::vector<std::vector<int>> devices;
  std::vector<int> type_order;  // cluster type ids along the pipeline
  bool strided = false;         // stage groups packed in nodes (else replicas packed in nodes)
  int replicas() const { return static_cast<int>(devices.size()); }
  int stages() const { return static_cast<int>(devices[0].size()); }
  // Whether any stage's data-parallel group spans more than one node.
  bool groupsCrossNodes(const Cluster& cluster) const;
};

// The shapes for `subset`: R divides every kept type's count, 2 <= S = n / R <= layers (and
// <= options.max_stages), R <= global batch; every order of the kept types (all permutations for
// up to 5 types and 8 stages, else fastest-first, slowest-first and largest-memory-first); both
// placements when they differ.
std::vector<PipelineShape> pipelineShapes(const Cluster& cluster, const DeviceSubset& subset,
                                          int layers, const PlanOptions& options);

// Micro-batch counts tried for replicas whose smallest share is `share`: powers of two below
// it, and `share` itself.
std::vector<int> microBatchCounts(int share);

// `total` split into `parts` as evenly as possible, larger parts first.
std::vector<int> equalSplit(int total, int parts);

// ZeRO stages the exhaustive enumeration walks: 0..max.
std::vector<int> zeroStages(const PlanOptions& options);
// The ZeRO stages of pipelines' stage groups: zeroStages, or {0} without
// PlanOptions::zero_in_pipelines.
std::vector<int> pipelineZeroStages(const PlanOptions& options);

// commChoices for one data-parallel group of all of `subset`'s devices.
std::vector<CommPlan> commChoices(const Cluster& cluster, const DeviceSubset& subset,
                                  const PlanOptions& options);
// commChoices for the stage groups of `shape`; only the plain plan for one replica, which
// all-reduces nothing.
std::vector<CommPlan> commChoices(const Cluster& cluster, const PipelineShape& shape,
                                  const PlanOptions& options);

// Calls visit(micro_batches, schedule, zero_stage, comm) for every setting of a pipeline of
// `shape` whose replicas take equal shares, in the order both searches walk them.
template <typename Visit>
void forEachEqualPipelineSetting(const Cluster& cluster, const PlanOptions& options,
                                 const PipelineShape& shape, Visit&& visit) {
  const std::vector<CommPlan> comms = commChoices(cluster, shape, options);
  const int share = equalSplit(options.global_batch, shape.replicas()).back();
  for (int micro_batches : microBatchCounts(share))
    for (Schedule schedule : options.schedules)
      for (int zero : pipelineZeroStages(options))
        for (const CommPlan& comm : comms) visit(micro_batches, schedule, zero, comm);
}

// Builders. Ranks are numbered in device order (data parallel) or replica-major (pipelines).
Plan dataParallelPlan(const CostModel& model, const PlanOptions& options,
                      const std::vector<int>& devices, const std::vector<int>& shares,
                      const std::vector<int>& micro_batches, const std::vector<bool>& checkpoint,
                      int zero_stage, const CommPlan& comm);
Plan pipelinePlan(const CostModel& model, const PlanOptions& options, const PipelineShape& shape,
                  const std::vector<int>& cuts, const std::vector<bool>& checkpoint,
                  int micro_batches, Schedule schedule, int zero_stage, const CommPlan& comm);

// Prices `plan`: fills its prediction and every rank's predicted_memory. False when a rank does
// not fit.
bool price(const CostModel& model, Plan& plan);

// A key naming the strategy of a plan (device subset, data parallel or R x S pipelines): the
// planner keeps the best plan per key, so its top k are k different strategies.
std::string strategyKey(const DeviceSubset& subset, const PipelineShape* shape);

}  // namespace chorus::plan::detail
