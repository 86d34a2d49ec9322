// The Plan: one structure that the planner writes, the simulator runs and the runtime executes
// (docs/architecture.md, "The plan").
//
// Every strategy is one shape of it: heterogeneous data parallelism is R replicas of one stage
// each with uneven shares; a pipeline is one replica of S stages with uneven layer cuts; hybrids
// are R x S. A plan names cluster devices by id (cluster.h), so it is read against the cluster it
// was made for; plan_json.h (de)serializes it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "chorus/core/collective_kinds.h"
#include "chorus/core/device_spec.h"
#include "chorus/plan/device_catalog.h"
#include "chorus/plan/model_profile.h"

namespace chorus::plan {

enum class Schedule { kGpipe, kOneFOneB };

const char* toString(Schedule schedule);  // "gpipe", "1f1b"
Schedule parseSchedule(const std::string& text);

// A plan's gradient all-reduce uses core's vocabulary (core/collective_kinds.h). The cost model
// prices part of it: the algorithms kFlat and kHierarchical, the codecs kNone, kFp16, kBf16 and
// kInt8 (`priced`); it refuses to price the others rather than price them as something else. Lossy
// codecs change the numerics, so the planner uses them only when allowed
// (PlanOptions::allow_compression).
bool priced(AllReduceAlgorithm algorithm);
bool priced(CodecKind codec);
// The plan's spelling of an algorithm, in plan JSON and `chorus plan --algorithm`: "ring" for
// kFlat (which the cost model prices as one ring over all devices), core's name for the others.
const char* planName(AllReduceAlgorithm algorithm);
// The algorithm spelled `text` (planName); ConfigError listing the names otherwise.
AllReduceAlgorithm parsePlanAllReduceAlgorithm(const std::string& text);

// One pipeline stage of one replica: layers [first_layer, last_layer) on plan rank `rank`.
struct StagePlan {
  int first_layer = 0;
  int last_layer = 0;
  int rank = 0;
  // Samples per micro-batch on this stage. A one-stage replica accumulates
  // ceil(share / micro_batch) micro-batches, the last one holding the remainder. A pipeline
  // replica splits its share into Plan::micro_batches micro-batches as evenly as possible, and
  // micro_batch is the largest of them: ceil(share / micro_batches).
  int micro_batch = 1;
  // Activation checkpointing: keep only layer outputs, recompute the rest in backward.
  bool checkpoint = false;
};

// One data-parallel copy of the model.
struct ReplicaPlan {
  // Samples of each global batch this replica takes.
  int share = 0;
  std::vector<StagePlan> stages;
};

// One worker (plan rank) and the device it runs on.
struct RankPlan {
  int device = 0;           // cluster device id
  std::string device_type;  // the cluster's type name, checked when a plan is loaded
  std::string node;         // the cluster's node name
  Dtype precision = Dtype::kFp32;
  // Bytes this rank may use; 0 = the device's usable memory. Default: 0.
  std::uint64_t memory_budget = 0;
  // Emulated speed in (0, 1] (docs/architecture.md, "Emulated heterogeneity"). Default: 1.
  double emulated_speed = 1;
  // Filled by the cost model.
  std::uint64_t predicted_memory = 0;
  // The job device the rank runs on (kind, index, emulated speed, budget) in a plan the trainers
  // execute (made for a job's devices, or adopted for them); device_type is then its text form.
  // Empty in a plan of a described cluster, whose ranks name device types only. Default: empty.
  std::optional<DeviceSpec> spec;
};

// The job device `rank` of an executed plan runs on (RankPlan::spec). Throws ConfigError naming
// the rank's device type when the plan does not say (a cluster's plan, not adopted for a job).
const DeviceSpec& jobDevice(const RankPlan& rank);

// The gradient synchronization of the data-parallel groups, as the engines run it: the plan is
// where they read it (the job's [comm] keys, or the planner's choice, end up here). Value type.
struct CommPlan {
  // The all-reduce algorithm. The cost model prices kFlat (as one ring over all devices: the plan
  // spells it "ring") and kHierarchical; a plan with kAuto or kTwoD runs, but is not priced.
  // Default: kFlat.
  AllReduceAlgorithm algorithm = AllReduceAlgorithm::kFlat;
  // The codec where gradients cross nodes (among node leaders; among all ranks under kFlat) and
  // its knobs; `codec.seed` is the plan's seed. The cost model prices kNone, kFp16, kBf16 and
  // kInt8. Default: none.
  CodecOptions codec;
  // Gradient buckets (parallel::ReducerOptions has the rule): the first bucket launched holds at
  // most first_bucket_mb MiB, later ones bucket_mb, every one at most 1 / min_buckets of the
  // gradients; `overlap` all-reduces them during backward. Defaults: DDP's 25 and 1 MiB, 4, true.
  double bucket_mb = 25.0;
  double first_bucket_mb = 1.0;
  int min_buckets = 4;
  bool overlap = true;
  // Steps between gradient synchronizations: above 1, local SGD (each rank steps on its own
  // gradients, then parameters are averaged weighted by samples). The cost model charges a
  // synchronization every step. Default: 1.
  int sync_period = 1;

  bool operator==(const CommPlan&) const = default;
};

// What the cost model predicts for one training step. Times in seconds.
struct Prediction {
  double step_seconds = 0;
  double samples_per_second = 0;
  // Idle fraction of the critical replica's pipeline ((S-1)/(M+S-1) for equal stages; 0 for
  // one-stage replicas).
  double bubble_fraction = 0;
  // Compute (forward, backward, recompute) of the critical replica's busiest stage.
  double compute_seconds = 0;
  // Point-to-point activation/gradient transfers charged to the critical replica.
  double p2p_seconds = 0;
  // Gradient synchronization not hidden behind backward, plus the optimizer step.
  double exposed_comm_seconds = 0;
  double optimizer_seconds = 0;
};

struct Plan {
  // The model's name (a named shape, or the name in its JSON profile).
  std::string model;
  // Samples per step; the replicas' shares sum to it. REQUIRES: >= 1.
  int global_batch = 0;
  // Micro-batches per replica and step for pipelines (stages > 1). One-stage replicas derive
  // their accumulation from StagePlan::micro_batch. Default: 1.
  int micro_batches = 1;
  // The job's seed. Default: 0.
  std::uint64_t seed = 0;
  // Pipeline schedule (stages > 1). Default: kOneFOneB.
  Schedule schedule = Schedule::kOneFOneB;
  // ZeRO stage 0-3, sharding over each stage's data-parallel group. Default: 0.
  int zero_stage = 0;
  // With zero_stage >= 1: each rank's fraction of the sharded state (a contiguous slice of the
  // flattened parameters, parallel/zero.h), rank order, summing to 1. Default: empty = even.
  std::vector<double> zero_shards;
  std::vector<ReplicaPlan> replicas;
  std::vector<RankPlan> ranks;
  CommPlan comm;
  Prediction predicted;
  // Why the planner ranked this plan where it did (one line).
  std::string reason;
  // The model's memory profile as measured for the job (runtime/job/memory_calibration.h), when
  // the plan was made for devices with memory budgets: the workers size micro-batches, pipeline
  // shares and ZeRO's slices from it instead of measuring the model again. Default: empty.
  std::optional<ModelProfile> memory_profile;

  int stageCount() const {
    return replicas.empty() ? 0 : static_cast<int>(replicas[0].stages.size());
  }
  // Checks the structure against a model of `layer_count` layers: shares sum to global_batch,
  // stages of every replica cover [0, layer_count) in order with equal cuts across replicas,
  // every rank is used exactly once, micro-batches fit the schedule, the communication knobs are
  // in range. Throws ConfigError.
  void validate(int layer_count) const;
  // zero_shards: empty, or one fraction in [0, 1] per rank summing to 1 with a ZeRO stage.
  void validateZeroShards() const;
  // A short description: "DP x16, shares 12..4" or "2 replicas x 4 stages, cuts 0|10|19|28|34".
  std::string summary() const;
};

}  // namespace chorus::plan
