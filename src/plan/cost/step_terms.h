// Terms of a step's time shared by CostModel::evaluate and the planner's search, so that both
// compute every number the same way (the search's exactness tests compare them).
#pragma once

#include <optional>
#include <vector>

#include "chorus/plan/cost_model.h"
#include "chorus/plan/planner.h"

namespace chorus::plan::detail {

// Bytes per gradient element a data-parallel group reduces in: 16-bit when every member trains in
// the same 16-bit format, else fp32.
int gradElementBytes(const std::vector<Dtype>& dtypes);

// The reduction of a stage's gradients over `devices` (its data-parallel group), overlapping the
// backward pass: an all-reduce; ZeRO-2's reduce-scatter carries half its traffic, and ZeRO-3 adds
// the parameter all-gathers of forward and backward, prefetched (1.5x the all-reduce's traffic).
LinearCost stageSyncCost(const CostModel& model, const std::vector<int>& devices, int element_bytes,
                         const CommPlan& comm, int zero_stage);

// ZeRO-1 and -2 all-gather the updated fp32 parameters after the optimizer step
// (parallel/zero.h), and nothing overlaps it: half the traffic of an fp32 all-reduce over the
// group, whose cost this is. Zero for stages 0 and 3 (stage 3 gathers during the layers, in
// stageSyncCost) and for one device.
LinearCost zeroGatherCost(const CostModel& model, const std::vector<int>& devices,
                          const CommPlan& comm, int zero_stage);

// That all-gather of `params` parameters.
inline double zeroGatherSeconds(const LinearCost& cost, double params) {
  return cost.latency == 0 && cost.per_byte == 0 ? 0 : 0.5 * cost.seconds(params * 4);
}

// Each device's fraction of ZeRO's sharded state over the data-parallel group `devices`, as the
// runtime sizes `zero.shards = "memory"` (runtime/job/zero_shards.cc): in proportion to what a
// device's capacity leaves after its replicated state and one sample's activations. Empty for
// stage 0, one device or PlanOptions::zero_shards = kEven (even shards); nullopt when the devices
// cannot hold the state.
std::optional<std::vector<double>> zeroShards(const CostModel& model, const PlanOptions& options,
                                              const std::vector<int>& devices, int zero_stage);

// The slowest optimizer step of the group `devices` over `params` parameters, each device
// stepping its fraction (`shards`, empty: 1/n with ZeRO, everything without).
double groupOptimizerSeconds(const CostModel& model, const std::vector<int>& devices, double params,
                             int zero_stage, const std::vector<double>& shards);

// That all-reduce for a stage of `params` parameters, in buckets.
inline BucketedAllReduce stageSync(const CostModel& model, const LinearCost& cost,
                                   int element_bytes, double params) {
  return bucketedAllReduce(cost, params * element_bytes, model.options().bucket_bytes);
}

// Compute of a one-stage replica that accumulates `share` samples in micro-batches of
// `micro_batch` (the last holding the remainder), scaled by 1/speed. Sets *backward_last to the
// backward (with recompute) of the final micro-batch.
double accumulateSeconds(const CostModel& model, const DeviceType& type, Dtype dtype, double speed,
                         int layers, int share, int micro_batch, bool checkpoint,
                         double* backward_last);

// Host work outside compute for a replica's `share` samples (CostOptions::host_seconds_per_sample).
inline double hostSeconds(const CostModel& model, int share) {
  return model.options().host_seconds_per_sample * share;
}

// Exposed synchronization plus optimizer after a backward of `backward` seconds.
inline double tailSeconds(const BucketedAllReduce& sync, double backward, double optimizer) {
  return exposedSeconds(sync, backward) + optimizer;
}

// Appends `cost` unless an equal one is there (links crossed at a stage boundary).
void addDistinct(std::vector<LinearCost>& costs, const LinearCost& cost);

// In-flight micro-batches on stage `stage` of `stages`.
int inFlight(Schedule schedule, int stage, int stages, int micro_batches);

}  // namespace chorus::plan::detail
