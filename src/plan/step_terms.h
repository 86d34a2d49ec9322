// Terms of a step's time shared by CostModel::evaluate and the planner's search, so that both
// compute every number the same way (the search's exactness tests compare them).
#pragma once

#include <vector>

#include "chorus/plan/cost_model.h"

namespace chorus::plan::detail {

// Bytes per gradient element a data-parallel group reduces in: 16-bit when every member trains in
// the same 16-bit format, else fp32.
int gradElementBytes(const std::vector<Dtype>& dtypes);

// The all-reduce of a stage's gradients over `devices` (its data-parallel group). ZeRO-3 adds the
// parameter all-gathers of forward and backward: 1.5x the all-reduce's traffic.
LinearCost stageSyncCost(const CostModel& model, const std::vector<int>& devices, int element_bytes,
                         const CommPlan& comm, int zero_stage);

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
