// The memory model: the bytes one rank holds at the peak of a training step. The only memory
// estimate in chorus: the planner's search and its predicted memory per rank (cost_model.h), the
// pipeline cut (parallel/pipeline_layout.h) and the data-parallel micro-batch sizing under a memory
// budget (runtime) all ask it, so they cannot disagree.
//
// A rank running layers [first, last) of a model holds, in bytes:
//   state        fp32 weights (autocast keeps fp32 master parameters) of its layers (sharded by
//                ZeRO 3; a pipeline rank builds the whole model but keeps its stage's); fp32
//                gradients (whole in every stage: the local ones exist before the reduction); the
//                optimizer's state (MemoryOptions), sharded by ZeRO 1 and up, which then adds an
//                fp32 master copy of the rank's slice (in stage 3 that is its weights) and the
//                slice's gradient (parallel/zero.h);
//   buffers      the data-parallel reducer's flat gradient buckets (one more copy, held for the
//                whole step; ZeRO-2 frees each one after its reduce-scatter), ZeRO-3's gathered
//                layers (two of the widest: the one running and the next), autocast's 16-bit
//                weight copies, and, accumulating, one layer's fresh gradient beside the one it
//                is added to;
//   activations  what autograd keeps of the micro-batches in flight, the backward pass's peak of
//                one micro-batch (below), the transfers' buffers of a pipeline stage and the
//                batch's data, scaled from the profile's activation_element_bytes to the rank's
//                format; or the batch as loaded (inputs and targets together), when larger.
// The backward pass of layer l frees what layers above it kept and allocates its own gradients
// (LayerProfile::workspace_bytes), while the layers below still hold theirs. So one micro-batch
// peaks at max over the stage's layers l of (kept by layers [first, l] + workspace of l), and the
// other in-flight micro-batches add what the whole stage keeps. A step of one micro-batch whose
// backward allocates the parameter gradients holds, at layer l, only those of layers [l, last).
// With activation checkpointing (kStage) a micro-batch keeps only the stage's input and
// recomputes the stage in backward; with kLayer it keeps every layer's input and recomputes one
// layer at a time.
//
// The figures are only as good as the profile: the runtime calibrates the zoo models' profiles by
// measuring every layer with the counting allocator (runtime/job/memory_calibration.h); named
// transformer shapes and JSON profiles carry their own. The estimate grows with the micro-batch
// (piecewise linearly), which largestMicroBatch() inverts.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "chorus/plan/device_catalog.h"
#include "chorus/plan/model_profile.h"
#include "chorus/plan/plan.h"

namespace chorus::plan {

// What a rank keeps of a micro-batch between its forward and its backward pass.
enum class Checkpointing {
  kNone,   // the whole autograd graph
  kStage,  // the stage's input; backward recomputes the whole stage first
  kLayer,  // every layer's input; backward recomputes one layer at a time
};
const char* toString(Checkpointing checkpointing);  // "none", "stage", "layer"
// Parses "none" | "stage" | "layer" (also "off" = none, "on" = stage); ConfigError otherwise.
Checkpointing parseCheckpointing(const std::string& name);

// What the model knows about the job besides the model's layers. Value type.
struct MemoryOptions {
  // Bytes of optimizer state per parameter, in fp32: AdamW's two moments 8, SGD's momentum buffer
  // 4, plain SGD 0. Default: 8.
  double optimizer_state_bytes = 8;
};

// One rank's work, as the memory model sees it. Value type.
struct StageMemoryRequest {
  // Layers [first_layer, last_layer) of the model. REQUIRES: 0 <= first < last <= layers.
  int first_layer = 0;
  int last_layer = 0;
  // The format activations are computed in. Default: fp32.
  Dtype dtype = Dtype::kFp32;
  // Samples per micro-batch (>= 0; fractional averages allowed). Default: 1.
  double micro_batch = 1;
  // Micro-batches whose activations are held at once: 1 for a one-stage replica, S - s on stage
  // s under 1F1B, M under GPipe. Default: 1.
  int in_flight = 1;
  // Default: kNone.
  Checkpointing checkpointing = Checkpointing::kNone;
  // ZeRO stage 0-3 and the data-parallel group the state is sharded over. Default: 0, 1.
  int zero_stage = 0;
  int group = 1;
  // This rank's fraction of the sharded state (ZeRO shards sized by memory, parallel/zero.h);
  // 0 means an even shard, 1 / group. Default: 0.
  double shard_fraction = 0;
  // ZeRO with redundancy (zero.redundancy): the fraction of the sharded state this rank also
  // holds as a replica of its successor's slice — its optimizer state, master copy and
  // gradient. Default: 0 (no replica).
  double replica_fraction = 0;
  // Whether gradients are also held in flat all-reduce buckets for the whole step, as the
  // data-parallel trainer's reducer does (a pipeline stage reduces after its backward, when the
  // activations are gone). Default: false.
  bool gradient_buckets = false;
  // Whether the gradients exist before the backward pass reaches the peak: false when the step
  // is one micro-batch whose backward allocates them layer by layer, top down (the data-parallel
  // trainer sets them to none before each step), so at layer l only those of layers >= l exist.
  // Default: true (accumulation, or a pipeline stage, which zeroes them in place).
  bool gradients_held = true;
  // Micro-batches of data the rank holds at its peak (ModelProfile::input_bytes per sample when
  // it runs the first layer, target_bytes when it runs the last): 1 for the data-parallel
  // trainer, which loads one at a time; the pipeline trainer loads its replica's share at once.
  // Default: 1.
  int batch_micro_batches = 1;
  // Gradients of the stage's output the rank holds at its peak, per micro-batch: a pipeline stage
  // below the last keeps the received gradient through its backward pass and has the next one's
  // receive posted. Default: 0.
  int received_gradients = 0;
  // Inputs received ahead of their forward pass (a later pipeline stage posts the next receive
  // while it computes). Default: 0.
  int prefetched_inputs = 0;
};

// Predicted bytes of one rank at its peak, by kind. Value type.
struct MemoryEstimate {
  double weights = 0;
  double gradients = 0;
  double optimizer = 0;
  double buffers = 0;
  // With the batch's data: the larger of the backward pass's peak and the batch as loaded.
  double activations = 0;

  double total() const { return weights + gradients + optimizer + buffers + activations; }
};

// The memory model of one model. Immutable after construction; safe to share between threads.
// Value type (holds its own copy of the profile).
class MemoryModel {
 public:
  // Throws ConfigError when the profile is invalid (ModelProfile::validate) or an option negative.
  explicit MemoryModel(ModelProfile model, MemoryOptions options = {});

  const ModelProfile& model() const { return model_; }
  const MemoryOptions& options() const { return options_; }

  // Peak bytes of a rank doing `request`. Throws ConfigError for a layer range outside the model.
  MemoryEstimate estimate(const StageMemoryRequest& request) const;
  double peakBytes(const StageMemoryRequest& request) const { return estimate(request).total(); }

  // The largest micro-batch in [1, limit] whose peak stays within `capacity` bytes (ignoring
  // request.micro_batch); 0 when not even one sample fits. REQUIRES: limit >= 1.
  std::int64_t largestMicroBatch(StageMemoryRequest request, double capacity,
                                 std::int64_t limit) const;

 private:
  // Activation bytes at the rank's peak for one sample per micro-batch, at the profile's
  // activation_element_bytes: kept by the other micro-batches in flight (`others`), and the
  // backward peak of one (`peak`). The estimate is linear in the micro-batch unless gradients are
  // allocated during the backward pass (StageMemoryRequest::gradients_held).
  struct PerSample {
    double others = 0;
    double peak = 0;
  };
  PerSample activationsPerSample(const StageMemoryRequest& request) const;
  // The peak of activations and gradients when the backward pass allocates the gradients:
  // max over the stage's layers l of (activations kept by [first, l] + l's workspace) x scale x
  // micro-batch + gradients of layers [l, last).
  double progressivePeak(const StageMemoryRequest& request, double scale) const;
  // The largest values[l] for l in [first, last), in O(1) (a sparse table; the planner's searches
  // ask for every layer range).
  double rangeMax(const std::vector<std::vector<double>>& table, int first, int last) const;

  ModelProfile model_;
  MemoryOptions options_;
  // Prefix sums over layers [0, l) of parameters, activation bytes and output bytes.
  std::vector<double> params_, kept_, outputs_;
  // Sparse tables: widest layer; kept_[l + 1] + workspace of l (backward peak at layer l without
  // checkpointing); outputs_[l] + activation + workspace of l (recomputing layer l, kLayer).
  std::vector<std::vector<double>> widest_, backward_peak_, recompute_peak_;
  std::vector<int> log2_;  // floor(log2(n)) for n = 0..layers
};

// How chorus's trainers run a stage of a plan, as a request: layers [first, last) in `dtype`,
// `in_flight` micro-batches of `micro_batch` samples, `micro_batches` per step and replica, ZeRO
// stage and group, `checkpointing` when the stage checkpoints, of a model of `layers` layers. A
// one-stage replica (the data-parallel trainer) holds the reducer's buckets, loads one
// micro-batch at a time and holds its gradients at the peak only when it accumulates
// (micro_batches > 1); a pipeline stage holds the data of its replica's share (at the ends), its
// layers' weights (the pipeline trainer drops the others' after building) and its transfers'
// buffers. The
// planner's search, rankMemory() and the pipeline cut ask the model through it.
StageMemoryRequest trainerStageRequest(int first, int last, int layers, Dtype dtype,
                                       double micro_batch, int in_flight, int micro_batches,
                                       int zero_stage, int group, Checkpointing checkpointing);

// Largest micro-batch of a data-parallel trainer's rank computing in `dtype` that fits
// `budget_bytes` by `memory` with a tenth spare, its state sharded by ZeRO `zero_stage` over
// `group` ranks with `shard_fraction` of it here (0: even), and `replica_fraction` more as a
// replica of another rank's slice. What the trainer sizes micro-batches by and `chorus train`
// checks budgets with. Throws ConfigError naming `device` when not even one sample fits.
std::int64_t maxMicroBatch(const MemoryModel& memory, Dtype dtype, std::uint64_t budget_bytes,
                           const std::string& device, int zero_stage = 0, int group = 1,
                           double shard_fraction = 0, double replica_fraction = 0);

// Predicted peak bytes of every rank of `plan`, indexed like plan.ranks: each stage with its
// rank's precision, its micro-batches in flight under the plan's schedule (one for a one-stage
// replica, which holds the reducer's buckets), ZeRO sharding over the replicas, and `checkpointing`
// on the stages that checkpoint (StagePlan::checkpoint; the planner prices kLayer). What the cost
// model fills RankPlan::predicted_memory with. REQUIRES: plan.validate(layers) passes.
std::vector<double> rankMemory(const MemoryModel& memory, const Plan& plan,
                               Checkpointing checkpointing = Checkpointing::kLayer);

// ZeRO shards sized by memory: rank r's fraction of the sharded state (StageMemoryRequest's
// zero_stage decides what is sharded) in proportion to what `usable[r]` bytes leave after the
// rest of requests[r] (its replicated state and activations), so that every rank is left the
// same fraction of its headroom. Throws ConfigError naming the rank (by names[r]) that cannot hold
// even its replicated part, or the shortfall when the ranks together cannot hold the state.
std::vector<double> zeroShardsByMemory(const MemoryModel& memory,
                                       std::vector<StageMemoryRequest> requests,
                                       const std::vector<double>& usable,
                                       const std::vector<std::string>& names);

// A data-parallel rank's request as ZeRO's shards by memory size it, in the runtime and the
// planner alike: the whole model of `layers` layers in `dtype`, one sample, accumulating (as the
// trainers' micro-batch sizing sees a rank), ZeRO `zero_stage` over `group` ranks.
StageMemoryRequest zeroShardRequest(int layers, Dtype dtype, int zero_stage, int group);

// The same fractions without the diagnosis (the planner's search): nullopt where
// zeroShardsByMemory throws.
std::optional<std::vector<double>> fitZeroShardsByMemory(const MemoryModel& memory,
                                                         std::vector<StageMemoryRequest> requests,
                                                         const std::vector<double>& usable);

}  // namespace chorus::plan
