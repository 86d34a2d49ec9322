// The planner: searches the parallel strategies for a model on a described heterogeneous cluster
// and returns the best few plans with predicted step time, throughput, memory per rank and a
// one-line reason each wins or loses.
//
// The search space (docs/planner.md has the details):
//  * which devices: all, or leaving out the slowest device types (a T4 can slow a pipeline more
//    than it adds);
//  * heterogeneous data parallelism: every device a replica, uneven shares chosen so that all
//    finish together (min-max over integer shares; per rank the largest micro-batch that fits,
//    activation checkpointing where it pays);
//  * pipelines and data x pipeline hybrids: R identical replicas of S stages (every replica has
//    the same mix of device types), with the order of device types along the pipeline, two
//    placements (a replica's stages packed in a node, or each stage's data-parallel group packed in
//    a node), uneven layer cuts by dynamic programming (pipeline_partition.h), micro-batch count,
//    GPipe or 1F1B, checkpointing per stage;
//  * ZeRO stage 0-3, ring or hierarchical all-reduce, and (when allowed) fp16/int8 gradient
//    compression on inter-node links;
//  * precision per device from a policy (bf16 where supported, fp16 on V100/T4, ...).
// Every candidate is priced by the cost model and must fit every rank's memory. The search prunes
// with lower bounds but is exact within its space: exhaustivePlan() enumerates the same space
// naively and finds the same best step time (tests/plan/search/planner_test.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "chorus/plan/cluster.h"
#include "chorus/plan/cost_model.h"
#include "chorus/plan/model_profile.h"
#include "chorus/plan/plan.h"

namespace chorus::plan {

// How the planner sizes ZeRO's shards of a data-parallel group.
enum class ZeroShards {
  kEven,    // 1/n each
  kMemory,  // by the memory each device has left, as `zero.shards = "memory"` runs them
};

struct PlanOptions {
  // Samples per step. REQUIRES: >= 1.
  int global_batch = 0;
  // Plans returned, best first; each is the best of a distinct strategy (which devices, and data
  // parallel or which R x S). Default: 5.
  int top_k = 5;
  // Default: kMixed.
  PrecisionPolicy precision = PrecisionPolicy::kMixed;
  // Consider lossy gradient compression on inter-node links (changes the numerics).
  // Default: false.
  bool allow_compression = false;
  // Pipeline schedules considered. 1F1B has GPipe's bubble with less memory, so GPipe never wins
  // unless asked for alone. Default: {1F1B}.
  std::vector<Schedule> schedules = {Schedule::kOneFOneB};
  // Highest ZeRO stage considered. Default: 3.
  int max_zero_stage = 3;
  // Shards of data-parallel ZeRO plans (Plan::zero_shards); a pipeline's stage groups are priced
  // with even shards. Default: kMemory (the runtime's default).
  ZeroShards zero_shards = ZeroShards::kMemory;
  // Consider ZeRO in pipelines' stage groups too (the runtime shards one-stage replicas only).
  // Default: true.
  bool zero_in_pipelines = true;
  // Consider activation checkpointing (per stage or rank, only where it pays). Default: true.
  bool allow_checkpointing = true;
  // Consider pipelines and data x pipeline hybrids besides data parallelism. Default: true.
  bool allow_pipelines = true;
  // Consider plans that leave the slowest device types idle. Default: true.
  bool allow_dropping_devices = true;
  // Pipeline stages at most. Default: 0 (no limit but the layer count).
  int max_stages = 0;
  // Copied into every plan (the job's seed). Default: 0.
  std::uint64_t seed = 0;
  // The cost model's efficiencies, reserves and calibrations. Default: CostOptions{}.
  CostOptions cost;
};

struct PlanResult {
  // Best first; each carries its prediction, memory per rank and reason.
  std::vector<Plan> plans;
  // Devices in the cluster (plans may use fewer).
  int devices = 0;
  // The best plans with equal shares and equal layer cuts (what a homogeneous-minded system
  // would run), for the predicted gain; empty when none fits.
  std::optional<Plan> uniform_data_parallel;
  std::optional<Plan> uniform_pipeline;
  // Candidates priced (data-parallel configurations and pipeline partitions searched).
  long long candidates = 0;
  double search_seconds = 0;

  // Step time of the best uniform plan over the best plan's (> 1 means the search gained);
  // 0 when either is missing.
  double gainOverUniform() const;
};

// Searches the plans for `model` on `cluster`. Throws ConfigError on bad options; returns an empty
// `plans` when nothing fits in memory. Pure function of its inputs; thread-safe.
PlanResult planCluster(const Cluster& cluster, const ModelProfile& model,
                       const PlanOptions& options);

// The best plan of the same search space by plain enumeration of shares, micro-batches, cuts and
// checkpointing; exponential, for tests on clusters of a few devices. nullopt when nothing fits.
std::optional<Plan> exhaustivePlan(const Cluster& cluster, const ModelProfile& model,
                                   const PlanOptions& options);

}  // namespace chorus::plan
