// The analytic cost model: how long a training step of a plan takes on a cluster and how much
// memory each rank needs. The planner searches with it; the simulator replays its per-task times
// on a schedule; the runtime's measurements calibrate it; the pipeline cut, the replicas' start
// shares and the adaptive cut price their stages with microBatchSeconds (parallel::stageSeconds),
// so chorus has one time model.
//
// Compute: a stage's forward pass over layers [i, j) on micro-batch m takes
//   (j - i) * layer_overhead + max(F * m / (peak * efficiency), bytes / (bandwidth * memory_eff))
// (a roofline over the stage: matmul FLOPs against weights and activations streamed), times the
// slowdown of CPU workers that share their node's cores (Node::core_contention), backward
// twice that, and activation checkpointing adds one more forward. A one-stage replica accumulates
// its share in micro-batches; a pipeline replica takes sum_s t_s + (M - 1) max_s t_s (GPipe and
// 1F1B alike; 1F1B only needs less memory), every stage also paying its boundary transfers.
// Gradients synchronize per stage over the stage's data-parallel group in buckets overlapped with
// the last backward (comm_cost.h); then the optimizer step streams its state. The step is the
// slowest replica's pipeline plus its slowest exposed synchronization.
//
// Memory per rank is the memory model's (memory_model.h): the cost model asks it for each stage
// with the stage's micro-batches in flight (1F1B: S - s on stage s, GPipe: M), its ZeRO sharding
// and, for a stage that checkpoints, layer-wise recomputation.
#pragma once

#include <string>
#include <vector>

#include "chorus/plan/cluster.h"
#include "chorus/plan/comm_cost.h"
#include "chorus/plan/memory_model.h"
#include "chorus/plan/model_profile.h"
#include "chorus/plan/plan.h"

namespace chorus::plan {

// How ranks choose their arithmetic format.
enum class PrecisionPolicy {
  kFp32,   // fp32 everywhere (PyTorch's default)
  kTf32,   // tf32 matmuls where the device has them, fp32 elsewhere
  kMixed,  // bf16 where supported, else fp16 (loss scaling), else fp32; fp32 master weights
};
const char* toString(PrecisionPolicy policy);
PrecisionPolicy parsePrecisionPolicy(const std::string& text);

// A measured efficiency: on `device_type`, `dtype` reached `efficiency` of peak.
struct Calibration {
  std::string device_type;
  Dtype dtype = Dtype::kFp32;
  double efficiency = 0;
};

struct CostOptions {
  // Achievable fraction of peak FLOP/s for transformer-like layers on GPUs, per Dtype. Default:
  // 0.5 for tensor-core formats (Megatron-LM reaches 52% of A100 peak on GPT-3 175B, Narayanan et
  // al. SC'21), 0.7 for fp32 on CUDA cores.
  double gpu_efficiency[kDtypeCount] = {0.7, 0.5, 0.5, 0.5};
  // Achievable fraction of peak on CPUs (OpenBLAS sgemm reaches 60-80%; the rest of a training
  // step less). Default: 0.4.
  double cpu_efficiency = 0.4;
  // Measured efficiencies that override the defaults for a (type, dtype). For a measured type
  // (local_cluster.h) the figure is relative to its measured matmul rate and may exceed 1.
  std::vector<Calibration> calibrations;
  // Achievable fraction of peak memory bandwidth. Default: 0.8.
  double memory_efficiency = 0.8;
  // Fixed cost per layer and forward pass (kernel launches, framework overhead); backward costs
  // twice it. A CPU worker that keeps only part of a core (DeviceType::core_fraction < 1, e.g. an
  // emulated `cpu@0.25`) runs this overhead on that part too, so it takes overhead / fraction.
  // Measure it on a real run: a worker's compute at two batch sizes (bench/plan_validation.py).
  // Default: 30 us.
  double layer_overhead_seconds = 30e-6;
  // Memory a GPU process cannot use for the model (CUDA/ROCm context, allocator fragmentation,
  // workspaces). Default: 1.5 GiB.
  double gpu_reserved_bytes = 1.5 * (1ull << 30);
  // Same for a CPU worker (the process, libtorch, the data loader). Default: 1 GiB.
  double cpu_reserved_bytes = 1.0 * (1ull << 30);
  // Fraction of the rest kept free (peaks the model does not count). Default: 0.05.
  double memory_headroom = 0.05;
  // Fixed host work per step that no layer profile covers: loading and collating the batch, the
  // trainer's bookkeeping and its small collectives. Added to every step; measure it on a real
  // run (step time minus compute, bench/plan_validation.py). Default: 0.
  double step_overhead_seconds = 0;
  // Host work per training sample outside compute (loading and collating it): every data-parallel
  // rank does it for its own share before it computes, so it adds to each rank's path, not once
  // to the step; a pipeline's first stage does it for the replica's share. Measure it like the
  // layer overhead: the host time of two batch sizes. Default: 0.
  double host_seconds_per_sample = 0;
  // Encoding and decoding of a lossy gradient codec where gradients cross nodes, per byte of the
  // uncompressed gradient (measure it: `chorus bench comm --codecs none,fp16` on one host, where
  // the links are fast and the difference is the codec). Default: 0.
  double codec_seconds_per_byte = 0;
  // Gradient bucket size for overlapped synchronization. Default: 25 MiB (PyTorch DDP).
  double bucket_bytes = 25.0 * (1 << 20);
  // Optimizer state bytes per parameter besides weights and gradients (MemoryOptions): Adam's m
  // and v in fp32. Default: 8.
  double optimizer_state_bytes = 8;
  // Bytes the optimizer step reads and writes per parameter (Adam: weights, gradient, m, v,
  // master). Default: 32.
  double optimizer_traffic_bytes = 32;
};

// Everything the cost model derives for one plan. Value type.
struct PlanCost {
  Prediction prediction;
  // Per plan rank: predicted bytes and usable bytes.
  std::vector<double> memory;
  std::vector<double> capacity;
  // Per plan rank: busy compute seconds in the step.
  std::vector<double> compute;
  bool feasible = true;
  // Why not, naming the first rank that does not fit.
  std::string infeasible_reason;
};

// The analytic cost model of one model on one cluster. Immutable after construction; safe to
// share between threads. Holds references: `cluster` and `model` must outlive it.
class CostModel {
 public:
  CostModel(const Cluster& cluster, const ModelProfile& model, CostOptions options = {});
  // A temporary would dangle as soon as the constructing expression ends.
  CostModel(const Cluster&, ModelProfile&&, CostOptions = {}) = delete;
  CostModel(Cluster&&, const ModelProfile&, CostOptions = {}) = delete;
  CostModel(Cluster&&, ModelProfile&&, CostOptions = {}) = delete;

  const Cluster& cluster() const { return cluster_; }
  const ModelProfile& model() const { return model_; }
  const CostOptions& options() const { return options_; }

  // The format a device trains in under `policy`.
  static Dtype trainingDtype(const DeviceType& type, PrecisionPolicy policy);
  double efficiency(const DeviceType& type, Dtype dtype) const;
  // Bytes of the device the model may use (memory - reserve, minus headroom).
  double capacity(const DeviceType& type) const;
  // Factor >= 1 on the compute of a CPU worker of `type` that shares its node's cores with the
  // cluster's other CPU workers there: 1 + core_contention x min(1, the others' core_fraction
  // summed). It assumes every CPU worker of the node computes (plans that leave some idle are
  // priced a little high); a type on several such nodes takes its largest. 1 without contention.
  double coreSlowdown(const DeviceType& type) const;

  // Fixed seconds per layer and forward pass on `type` (CostOptions::layer_overhead_seconds).
  double layerOverhead(const DeviceType& type) const;
  // Forward seconds of layers [first, last) on `micro_batch` samples.
  double forwardSeconds(const DeviceType& type, Dtype dtype, int first, int last,
                        double micro_batch) const;
  // Forward + backward (+ recompute) seconds of one micro-batch.
  double microBatchSeconds(const DeviceType& type, Dtype dtype, int first, int last,
                           double micro_batch, bool checkpoint) const;
  // The memory model of this model (memory_model.h), with CostOptions::optimizer_state_bytes.
  const MemoryModel& memory() const { return memory_; }
  // Bytes a stage needs: `in_flight` micro-batches of activations, state sharded over `group`,
  // layer-wise recomputation when `checkpoint`, as chorus's trainers run it with `micro_batches`
  // micro-batches per step (trainerStageRequest; a stage of all layers is a one-stage replica),
  // holding `shard_fraction` of the sharded state (0: 1 / group).
  double stageMemory(Dtype dtype, int first, int last, double micro_batch, int in_flight,
                     int zero_stage, int group, bool checkpoint, int micro_batches,
                     double shard_fraction = 0) const;
  // Bytes a stage boundary after layer `last - 1` carries per micro-batch.
  double boundaryBytes(Dtype dtype, int last, double micro_batch) const;
  // Parameters of layers [first, last).
  double params(int first, int last) const { return prefix_params_[last] - prefix_params_[first]; }
  // Seconds of the optimizer step for `params` parameters sharded `shard` ways.
  double optimizerSeconds(const DeviceType& type, double params, int shard) const;

  // Prices a whole plan. REQUIRES: plan.validate(model.layerCount()) passes and its ranks name
  // devices of this cluster (else ConfigError).
  PlanCost evaluate(const Plan& plan) const;

 private:
  const Cluster& cluster_;
  const ModelProfile& model_;
  CostOptions options_;
  MemoryModel memory_;
  std::vector<double> prefix_params_, prefix_flops_, prefix_activation_;
  // coreSlowdown() per contended type name; empty when no node has contention.
  std::vector<std::pair<std::string, double>> slowdown_;
};

}  // namespace chorus::plan
