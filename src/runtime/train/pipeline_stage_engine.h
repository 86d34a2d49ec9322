// Private to runtime: the step engine of a plan with S > 1 stages per replica — pipeline and hybrid
// parallelism (trainer.h). Its files: pipeline_stage_engine.cc (construction and the step),
// pipeline_stage_evaluation.cc, pipeline_stage_checkpoint.cc and pipeline_stage_layers.cc.
#pragma once

#include <torch/optim.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chorus/data/sampler.h"
#include "chorus/model/zoo_model.h"
#include "chorus/parallel/loss_scaler.h"
#include "chorus/parallel/pipeline.h"
#include "chorus/plan/plan.h"
#include "chorus/runtime/checkpoint/checkpoint.h"
#include "chorus/runtime/job/pipeline_job.h"
#include "train/pipeline_balancing.h"
#include "train/pipeline_recut.h"
#include "train/trainer_state.h"

namespace chorus::runtime {

// One rank's stage: owns the parallel::PipelineEngine over the stage's layers, the optimizer over
// their parameters and the replicas' balancer; the job, data, sampler and model (all of it is
// built with the job's seed; only the stage's layers train here and hold values) are the
// context's. The members
// are the state its files share. Used by one thread; non-copyable.
struct PipelineStageEngine final : StepEngine {
  PipelineStageEngine(TrainingContext& context, const plan::Plan& plan);
  PipelineStageEngine(const PipelineStageEngine&) = delete;
  PipelineStageEngine& operator=(const PipelineStageEngine&) = delete;

  StepRecord step(std::int64_t step, const TrainerHooks& hooks) override;
  std::pair<double, double> evaluate(std::int64_t samples) override;
  nlohmann::json checkpointEntries() const override;
  CheckpointSnapshot snapshot() override;
  void restore(const CheckpointSource& source) override;
  parallel::StagePosition position() const override { return engine->position(); }
  const std::vector<int>& cuts() const override { return stage_cuts; }
  const std::vector<std::int64_t>& shares() const override { return options.replica_shares; }
  const std::vector<at::Tensor>& parameters() const override { return engine->parameters(); }
  parallel::Precision precision() const override { return options.precision; }
  double lossScale() const override { return scaler ? scaler->scale() : 0.0; }
  device::EmulationTotals emulationTotals() const override {
    return (speed_override ? *speed_override : worker->emulator()).totals();
  }
  std::int64_t skippedSteps() const override { return skipped_steps; }

  // The engine's resources: the worker's world and emulator (or the speed hook's), the replicas'
  // all-reduce from the plan's `comm` with its codec, and after a new cut the previous engine's
  // stage group and codec engine (`previous`; null for the first engine).
  parallel::PipelineResources engineResources(const parallel::PipelineEngine* previous) const;
  // Hooks an fp16 stage's unscaler onto the engine's parameters (again after a new cut).
  void attachUnscaler();
  // Keeps the values of the stage's layers only (pipeline_stage_layers.cc): every rank builds the
  // whole model, and the other layers' parameters give their bytes back; a stage parameter
  // without bytes (a layer a new cut brought here) gets them again, uninitialized. Again after a
  // new cut.
  void holdStageLayersOnly();

  int stages() const { return options.pipeline_stages; }
  bool firstStage() const { return position().stage == 0; }
  bool lastStage() const { return position().stage + 1 == stages(); }

  // The context's members, by reference.
  JobConfig& job;
  std::shared_ptr<Worker>& worker;
  TrainingData& data;
  std::unique_ptr<data::GlobalSampler>& sampler;
  std::shared_ptr<model::ZooModel>& model;

  // replica_shares: the shares the next step runs with (the balancer's, kept in step with it).
  parallel::PipelineOptions options;
  std::int64_t global_batch = 0;  // the plan's: samples per step, all replicas
  std::vector<int> stage_cuts;
  std::unique_ptr<ReplicaBalancer> balancer;
  // The emulated speed (TrainerHooks::speed_at) and the emulator that pads to it when the hook
  // overrides the device's speed; the engine pads with the worker's emulator otherwise.
  double speed = 1.0;
  std::unique_ptr<device::SpeedEmulator> speed_override;
  std::unique_ptr<parallel::PipelineEngine> engine;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  // An fp16 stage's loss scale and the hooks that unscale its parameters' gradients.
  std::optional<parallel::DynamicLossScaler> scaler;
  std::unique_ptr<parallel::GradientUnscaler> unscaler;
  // The plan's gradient synchronization of the replicas (buckets, codec).
  plan::CommPlan comm;
  // The codec of the replicas' gradient all-reduce (comm.codec), for checkpoints.
  std::shared_ptr<parallel::GradientCodec> codec;
  // Steps every rank skipped on an overflow somewhere (overflow consensus).
  std::int64_t skipped_steps = 0;
  // The adaptive cut (parallel.recut): moves layers between stages after a step, rebuilding
  // engine and optimizer and changing stage_cuts.
  std::unique_ptr<PipelineRecut> recut;
  // Samples per evaluation chunk: 256, or a training micro-batch under a memory budget.
  std::int64_t eval_chunk = 256;
};

// The (name, tensor) pairs of the stage's layers: parameters and buffers, named as in the whole
// model ("block2.attention.weight"), so checkpoints are readable and checkable by name.
std::vector<std::pair<std::string, at::Tensor>> stageTensors(PipelineStageEngine& s);

}  // namespace chorus::runtime
