// The planner's two searches within one configuration: uneven data-parallel shares, and uneven
// pipeline cuts. planner.cc enumerates the configurations and keeps the best plans.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "search/search_space.h"

namespace chorus::plan::detail {

// A rank's best way to take b samples alone: cost[b - 1] (compute plus exposed synchronization
// and optimizer), with the micro-batch and checkpointing that achieve it. Shares run 1..max.
struct RankChoices {
  std::vector<double> cost;
  std::vector<int> micro_batch;
  std::vector<bool> checkpoint;
};

// Choices of a device type in a data-parallel group of `group` devices with synchronization
// `sync` (bucketed, per step) followed by `after_sync` seconds (the group's slowest optimizer
// step, and ZeRO-1/2's all-gather), holding `shard_fraction` of ZeRO's sharded state (0: even);
// nullopt when even one sample does not fit.
std::optional<RankChoices> dataParallelChoices(const CostModel& model, const PlanOptions& options,
                                               const DeviceType& type,
                                               const BucketedAllReduce& sync, int group,
                                               int zero_stage, double shard_fraction, int max_share,
                                               double after_sync);

// The best uneven-share data-parallel plan over `subset` (or with equal shares when
// `equal_shares`), priced; nullopt when none fits.
std::optional<Plan> searchDataParallel(const CostModel& model, const PlanOptions& options,
                                       const DeviceSubset& subset, int zero_stage,
                                       const CommPlan& comm, bool equal_shares = false);

// A lower bound on the step time of any partition of `shape` with `micro_batches`, and (in
// *sum_bound) on sum_s t_s + max_s e_s.
double pipelineLowerBound(const CostModel& model, const PlanOptions& options,
                          const PipelineShape& shape, int micro_batches, double* sum_bound);

// The best cuts (and checkpointing per stage) for `shape` over the communication choices
// `comms` (which share the compute terms), priced; nullopt when nothing fits or nothing beats
// `upper_bound()` (asked again before each choice, as it tightens).
std::optional<Plan> searchPipeline(const CostModel& model, const PlanOptions& options,
                                   const PipelineShape& shape, int micro_batches, Schedule schedule,
                                   int zero_stage, const std::vector<CommPlan>& comms,
                                   const std::function<double()>& upper_bound);

// The same shape with equal layer counts per stage (checkpointing where needed to fit), priced.
std::optional<Plan> uniformPipeline(const CostModel& model, const PlanOptions& options,
                                    const PipelineShape& shape, int micro_batches,
                                    Schedule schedule, int zero_stage, const CommPlan& comm);

}  // namespace chorus::plan::detail
