// Private to runtime: the step engine of a plan with one stage per replica — heterogeneous data
// parallelism (trainer.h). Its files: data_parallel_engine.cc (the step), data_parallel_setup.cc
// (construction: reducer, precision, micro-batch under a memory budget),
// data_parallel_evaluation.cc, data_parallel_checkpoint.cc, data_parallel_zero.cc (ZeRO's part
// of a checkpoint) and data_parallel_handover.cc (elastic recovery).
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

// The StepEngine of one rank of a data-parallel plan. Owns the optimizer (or ZeRO's of this
// rank's slice), the gradient reducer, the load balancer, the loss scaler and the codec; the job,
// data, sampler and model are the context's, which must outlive it. Used by one thread;
// non-copyable.
class DataParallelEngine final : public StepEngine {
 public:
  DataParallelEngine(TrainingContext& context, const plan::Plan& plan);
  DataParallelEngine(const DataParallelEngine&) = delete;
  DataParallelEngine& operator=(const DataParallelEngine&) = delete;

  StepRecord step(std::int64_t step, const TrainerHooks& hooks) override;
  std::pair<double, double> evaluate(std::int64_t samples) override;
  nlohmann::json checkpointEntries() const override;
  CheckpointSnapshot snapshot() override;
  void restore(const CheckpointSource& source) override;
  parallel::StagePosition position() const override { return {worker_->rank(), 0}; }
  const std::vector<int>& cuts() const override { return cuts_; }
  const std::vector<std::int64_t>& shares() const override {
    return fixed_shares_.empty() ? balancer_->shares() : fixed_shares_;
  }
  // Throws the CommError of a step whose parameter all-gather failed (stale_parameters_) until a
  // recovery gathers them: the live tensors would be the step's half-updated values.
  const std::vector<at::Tensor>& parameters() const override {
    requireGatheredParameters();
    return model_parameters_;
  }
  std::vector<at::Tensor> parameterValues() override;
  parallel::Precision precision() const override { return compute_precision_; }
  double lossScale() const override { return scaler_ ? scaler_->scale() : 0.0; }
  device::EmulationTotals emulationTotals() const override { return emulator_->totals(); }
  std::int64_t skippedSteps() const override { return skipped_steps_; }
  // Elastic recovery (data_parallel_handover.cc).
  std::string handover(const std::vector<int>& kept,
                       const std::vector<std::int64_t>& next_shares) override;
  LocalCarry localCarry() const override;
  void adopt(const std::string& handover, const LocalCarry& carry) override;

  // For elastic recovery: ZeRO's optimizer of this rank's slice (its replicas rebuild the
  // slices), null without ZeRO; the optimizer of the whole model (a pipeline's layers arrive
  // in it), null under ZeRO.
  parallel::ZeroOptimizer* zero() { return zero_.get(); }
  torch::optim::Optimizer* replicatedOptimizer() { return optimizer_.get(); }

 private:
  struct ShareResult;

  // Construction (data_parallel_setup.cc).
  parallel::ReducerOptions reducerOptions();
  void setUpZero(const plan::Plan& plan, parallel::ReducerOptions& reducing);
  void setUpPrecision(const plan::RankPlan& rank);
  // The step (data_parallel_engine.cc).
  std::vector<std::vector<std::int64_t>> microBatchesOf(
      const std::vector<std::int64_t>& mine, const std::vector<std::int64_t>& shares) const;
  ShareResult runShare(const std::vector<std::int64_t>& mine,
                       const std::vector<std::int64_t>& shares, bool inject, bool arm_reducer);
  void releaseHeldBuckets(device::SpeedEmulator::ComputeScope& phase);
  void stepZero();
  // The model's forward, through zero_layers_ under ZeRO-3 (collective there).
  at::Tensor forward(at::Tensor inputs) {
    return zero_layers_ ? zero_layers_->forward(*model_, std::move(inputs))
                        : model_->forward(std::move(inputs));
  }
  torch::optim::Optimizer& activeOptimizer() { return zero_ ? zero_->optimizer() : *optimizer_; }
  // Sets the model's gradients to none (and nothing of ZeRO's slice, which is overwritten).
  void clearGradients() {
    if (zero_)
      zero_->clearGradients();
    else
      optimizer_->zero_grad(/*set_to_none=*/true);
  }
  // Throws the CommError of stale_parameters_ when the parameters are stale: a step, an
  // evaluation or a checkpoint of them would be wrong.
  void requireGatheredParameters() const;
  // Evaluation (data_parallel_evaluation.cc).
  std::int64_t evaluationPasses(std::int64_t test_size, std::int64_t limit) const;
  // Checkpoints (data_parallel_checkpoint.cc).
  void restoreRankState(const std::string& bytes);
  void restorePipelineCheckpoint(const CheckpointSource& source);
  // ZeRO's part of a checkpoint (data_parallel_zero.cc): this rank's optimizer slice into its
  // rank archive, and its "zero" entry of trainer.json (the stage, every rank's slice bounds, the
  // flat order).
  void writeZeroSlice(torch::serialize::OutputArchive& archive) const;
  nlohmann::json zeroEntry() const;
  // Loads the optimizer's state from a checkpoint of either kind, replicated (optimizer.pt) or
  // ZeRO (every rank's slice, whatever the world size, shards, stage or bucket sizes that wrote
  // it), into this engine's optimizer of either kind; and the parameters where the model file
  // does not hold them (a ZeRO-3 checkpoint) or the engine cannot take them from it (a ZeRO-3
  // engine, whose master slice gets them). Throws CheckpointError when it is of another model.
  void restoreOptimizer(const CheckpointSource& source);
  // A ZeRO engine resuming a ZeRO checkpoint of its own flat order reads only its own slices,
  // unless it needs the whole parameters from ZeRO-3's slices (a stage 1 or 2 engine, whose
  // parameters are whole). True when it did.
  bool restoreOwnSlices(const CheckpointSource& source);

  // The context's members, by reference.
  JobConfig& job_;
  std::shared_ptr<Worker>& worker_;
  TrainingData& data_;
  std::unique_ptr<data::GlobalSampler>& sampler_;
  std::shared_ptr<model::ZooModel>& model_;

  std::int64_t global_batch_ = 0;             // the plan's: samples per step, all ranks
  plan::CommPlan comm_;                       // the plan's gradient synchronization
  std::vector<int> cuts_;                     // {0, layers}: one stage
  std::vector<at::Tensor> model_parameters_;  // the model's, in its order
  // The optimizer of the whole model; null under ZeRO, whose optimizer steps this rank's slice.
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<parallel::ZeroOptimizer> zero_;  // plan.zero_stage >= 1; else null
  // ZeRO-3: the layers gathered from the slices when they run; null below stage 3.
  std::unique_ptr<parallel::ZeroLayers> zero_layers_;
  // ZeRO-3: every rank's micro_limit_, since all ranks must run as many forward and backward
  // passes (each gathers every layer); empty below stage 3.
  std::vector<std::int64_t> micro_limits_;
  std::unique_ptr<parallel::GradientReducer> reducer_;
  std::unique_ptr<plan::LoadBalancer> balancer_;
  // The plan's shares when balancer.shares fixes them (the balancer then does not run); else
  // empty.
  std::vector<std::int64_t> fixed_shares_;
  device::SpeedEmulator* emulator_ = nullptr;  // the worker's, or speed_override_'s
  // The compute phase in progress (runShare), in which the reducer holds each gradient bucket
  // back (reducerOptions) when this rank emulates a slower device; null between phases.
  device::SpeedEmulator::ComputeScope* phase_ = nullptr;
  // For each bucket held back in the phase, in launch order: the phase's compute when the
  // bucket's gradients were final (ComputeScope::computeSoFar), where its launch belongs.
  std::vector<double> held_at_;
  // The timeline this step is recorded on (TrainerHooks::trace while it records), or null.
  observe::TraceRecorder* trace_ = nullptr;
  std::unique_ptr<device::SpeedEmulator> speed_override_;  // set by TrainerHooks::speed_at
  double speed_ = 1.0;
  std::int64_t micro_limit_ = 0;  // max samples per micro-batch on this rank (0: none)
  // Mixed precision: the rank's compute format; fp16 ranks scale their loss.
  parallel::Precision compute_precision_ = parallel::Precision::kFp32;
  std::optional<parallel::DynamicLossScaler> scaler_;
  std::unique_ptr<parallel::GradientUnscaler> unscaler_;
  std::int64_t skipped_steps_ = 0;
  // ZeRO with replicas: why the last step's all-gather of the parameters failed (a lost peer),
  // leaving them stale until the recovery rebuilds them; empty when they are whole.
  std::string stale_parameters_;
  // Gradient compression (null: none); its memory (residuals, PowerSGD's Q) is checkpointed.
  std::shared_ptr<parallel::GradientCodec> codec_;
  // Local SGD (comm.sync_every > 1): samples this rank took since the last parameter average.
  std::int64_t samples_since_average_ = 0;
};

}  // namespace chorus::runtime
