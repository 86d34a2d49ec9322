// Private to runtime: the step engine of a plan with one stage per replica — heterogeneous data
// parallelism (trainer.h). Its files: data_parallel_engine.cc (the step), data_parallel_setup.cc
// (construction: reducer, precision, micro-batch under a memory budget),
// data_parallel_evaluation.cc and data_parallel_checkpoint.cc.
#pragma once

#include <torch/optim.h>

#include <memory>
#include <optional>
#include <vector>

#include "chorus/device/speed_emulator.h"
#include "chorus/parallel/compression.h"
#include "chorus/parallel/gradient_reducer.h"
#include "chorus/parallel/loss_scaler.h"
#include "chorus/parallel/precision.h"
#include "chorus/parallel/zero.h"
#include "chorus/parallel/zero_layers.h"
#include "chorus/plan/balancer.h"
#include "train/trainer_state.h"

namespace chorus::observe {
class TraceRecorder;
}
namespace torch::serialize {
class OutputArchive;
}

namespace chorus::runtime {

// Owns the optimizer, the gradient reducer, the load balancer, the loss scaler and the codec of
// one rank; the job, data, sampler and model are the context's. The members are the state its
// files share. Used by one thread; non-copyable.
struct DataParallelEngine final : StepEngine {
  DataParallelEngine(TrainingContext& context, const plan::Plan& plan);
  DataParallelEngine(const DataParallelEngine&) = delete;
  DataParallelEngine& operator=(const DataParallelEngine&) = delete;

  StepRecord step(std::int64_t step, const TrainerHooks& hooks) override;
  std::pair<double, double> evaluate(std::int64_t samples) override;
  nlohmann::json checkpointEntries() const override;
  CheckpointSnapshot snapshot() override;
  void restore(const CheckpointSource& source) override;
  parallel::StagePosition position() const override { return {worker->rank(), 0}; }
  const std::vector<int>& cuts() const override { return cuts_of_model; }
  const std::vector<std::int64_t>& shares() const override {
    return fixed_shares.empty() ? balancer->shares() : fixed_shares;
  }
  // Throws the CommError of a step whose parameter all-gather failed (stale_parameters) until a
  // recovery gathers them: the live tensors would be the step's half-updated values.
  const std::vector<at::Tensor>& parameters() const override {
    requireGatheredParameters();
    return model_parameters;
  }
  std::vector<at::Tensor> parameterValues() override;
  parallel::Precision precision() const override { return compute_precision; }
  double lossScale() const override { return scaler ? scaler->scale() : 0.0; }
  device::EmulationTotals emulationTotals() const override { return emulator->totals(); }
  std::int64_t skippedSteps() const override { return skipped_steps; }
  // Elastic recovery (data_parallel_handover.cc).
  std::string handover(const std::vector<int>& kept,
                       const std::vector<std::int64_t>& next_shares) override;
  LocalCarry localCarry() const override;
  void adopt(const std::string& handover, const LocalCarry& carry) override;

  // The context's members, by reference: the code of the engine's files reads as it did when
  // they were one trainer's.
  JobConfig& job;
  std::shared_ptr<Worker>& worker;
  TrainingData& data;
  std::unique_ptr<data::GlobalSampler>& sampler;
  std::shared_ptr<model::ZooModel>& model;

  std::int64_t global_batch = 0;             // the plan's: samples per step, all ranks
  std::vector<int> cuts_of_model;            // {0, layers}: one stage
  std::vector<at::Tensor> model_parameters;  // the model's, in its order
  // The optimizer of the whole model; null under ZeRO, whose optimizer steps this rank's slice.
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<parallel::ZeroOptimizer> zero;  // plan.zero_stage >= 1; else null
  // ZeRO-3: the layers gathered from the slices when they run; null below stage 3.
  std::unique_ptr<parallel::ZeroLayers> zero_layers;
  // The model's forward, through zero_layers under ZeRO-3 (collective there).
  at::Tensor forward(at::Tensor inputs) {
    return zero_layers ? zero_layers->forward(*model, std::move(inputs))
                       : model->forward(std::move(inputs));
  }
  // ZeRO-3: every rank's micro_limit, since all ranks must run as many forward and backward
  // passes (each gathers every layer); empty below stage 3.
  std::vector<std::int64_t> micro_limits;
  torch::optim::Optimizer& activeOptimizer() { return zero ? zero->optimizer() : *optimizer; }
  // Sets the model's gradients to none (and nothing of ZeRO's slice, which is overwritten).
  void clearGradients() {
    if (zero)
      zero->clearGradients();
    else
      optimizer->zero_grad(/*set_to_none=*/true);
  }
  std::unique_ptr<parallel::GradientReducer> reducer;
  std::unique_ptr<plan::LoadBalancer> balancer;
  // The plan's shares when balancer.shares fixes them (the balancer then does not run); else empty.
  std::vector<std::int64_t> fixed_shares;
  device::SpeedEmulator* emulator = nullptr;  // the worker's, or speed_override's
  // The compute phase in progress (runShare), in which the reducer holds each gradient bucket
  // back (reducerOptions) when this rank emulates a slower device; null between phases.
  device::SpeedEmulator::ComputeScope* phase = nullptr;
  // For each bucket held back in the phase, in launch order: the phase's compute when the
  // bucket's gradients were final (ComputeScope::computeSoFar), where its launch belongs.
  std::vector<double> held_at;
  // The timeline this step is recorded on (TrainerHooks::trace while it records), or null.
  observe::TraceRecorder* trace = nullptr;
  std::unique_ptr<device::SpeedEmulator> speed_override;  // set by TrainerHooks::speed_at
  double speed = 1.0;
  std::int64_t micro_limit = 0;  // max samples per micro-batch on this rank (0: none)
  // Mixed precision: the rank's compute format; fp16 ranks scale their loss.
  parallel::Precision compute_precision = parallel::Precision::kFp32;
  std::optional<parallel::DynamicLossScaler> scaler;
  std::unique_ptr<parallel::GradientUnscaler> unscaler;
  std::int64_t skipped_steps = 0;
  // ZeRO with replicas: why the last step's all-gather of the parameters failed (a lost peer),
  // leaving them stale until the recovery rebuilds them; empty when they are whole.
  std::string stale_parameters;
  // Throws that CommError when the parameters are stale: a step, an evaluation or a checkpoint
  // of them would be wrong.
  void requireGatheredParameters() const;
  // Gradient compression (null: none); its memory (residuals, PowerSGD's Q) is checkpointed.
  std::shared_ptr<parallel::GradientCodec> codec;
  // Local SGD (comm.sync_every > 1): samples this rank took since the last parameter average.
  std::int64_t samples_since_average = 0;
};

// ZeRO's part of a checkpoint (data_parallel_zero.cc): this rank's optimizer slice into its rank
// archive, and its "zero" entry of trainer.json (the stage, every rank's slice bounds, the flat
// order).
void writeZeroSlice(const DataParallelEngine& engine, torch::serialize::OutputArchive& archive);
nlohmann::json zeroEntry(const DataParallelEngine& engine);
// Loads the optimizer's state from a checkpoint of either kind, replicated (optimizer.pt) or ZeRO
// (every rank's slice, whatever the world size, shards, stage or bucket sizes that wrote it), into
// this engine's optimizer of either kind; and the parameters where the model file does not hold
// them (a ZeRO-3 checkpoint) or the engine cannot take them from it (a ZeRO-3 engine, whose
// master slice gets them). Throws CheckpointError when it is of another model.
void restoreOptimizer(DataParallelEngine& engine, const CheckpointSource& source);

}  // namespace chorus::runtime
