// Private to runtime: what one rank's Trainer (the executor) holds, and the helpers its engines
// share.
#pragma once

#include <torch/optim.h>

#include <functional>
#include <future>
#include <map>
#include <memory>

#include "chorus/data/dataset.h"
#include "chorus/data/sampler.h"
#include "chorus/model/zoo_model.h"
#include "chorus/plan/memory_model.h"
#include "chorus/runtime/checkpoint/checkpoint.h"
#include "chorus/runtime/launch/elastic_membership.h"
#include "chorus/runtime/train/trainer.h"
#include "train/step_engine.h"
#include "train/zero_replicas.h"

namespace chorus::runtime {

struct TrainingData {
  std::shared_ptr<data::Dataset> train;
  std::shared_ptr<data::Dataset> test;
};

// Builds the job's datasets and fits the model config to them (classes, vocabulary, shapes).
TrainingData makeTrainingData(const JobConfig& job, model::ModelConfig& model);

// What every step engine of a rank shares with the executor: the job, the worker, the job's
// data (job.model fitted to it), the global sampler, and the model built from the seed on the
// worker's device with rank 0's parameters on every rank (whatever each rank's own
// initialization did). Owned by Trainer::State; engines hold a reference.
struct TrainingContext {
  JobConfig job;
  std::shared_ptr<Worker> worker;
  TrainingData data;
  std::unique_ptr<data::GlobalSampler> sampler;
  std::shared_ptr<model::ZooModel> model;
};
// Builds the context. Collective when `share_parameters` (rank 0's parameters are broadcast); a
// worker that joins a running job takes them from the members instead.
std::unique_ptr<TrainingContext> startTraining(JobConfig job, std::shared_ptr<Worker> worker,
                                               bool share_parameters = true);

// The optimizer of the job over `parameters`, and its learning rate at `step`.
std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const OptimizerSection& options,
                                                       std::vector<at::Tensor> parameters);
double learningRateAt(const OptimizerSection& options, std::int64_t step, std::int64_t steps);
void setLearningRate(torch::optim::Optimizer& optimizer, double lr);

// The engine that runs `plan` on this rank: DataParallelEngine for one stage per replica,
// PipelineStageEngine otherwise. Throws ConfigError when the plan does not fit the engine.
std::unique_ptr<StepEngine> makeDataParallelEngine(TrainingContext& context,
                                                   const plan::Plan& plan);
std::unique_ptr<StepEngine> makePipelineStageEngine(TrainingContext& context,
                                                    const plan::Plan& plan);

// The executor's state: the context, the engine that computes the plan's steps, and the
// checkpoints — the writer (null without checkpoint.dir), the write in flight (async mode) and
// the step of the newest checkpoint written or resumed from.
struct Trainer::State {
  std::unique_ptr<TrainingContext> context;
  plan::Plan plan;  // as it runs now (elastic recovery replaces it with the next generation's)
  // The plan the job was launched with, by launch rank: a worker that joins in place of a launch
  // rank takes that rank's entry (elastic.max_restarts).
  plan::Plan launch_plan;
  // Members that joined -> the launch rank whose device each runs on (launch members: their own).
  std::map<int, int> slots;
  std::unique_ptr<StepEngine> engine;
  // elastic.enabled: this worker's membership (heartbeat, agreement); else null.
  std::unique_ptr<ElasticMembership> membership;
  // The launch ranks of the world the engine and the plan were built for, in rank order.
  std::vector<int> engine_members;
  // Background checkpoints of an earlier generation, left to end on their own.
  std::vector<std::future<std::string>> abandoned_checkpoints;
  std::int64_t next_step = 0;
  // ZeRO with replicas, during a recovery: the slices this rank held when the loss struck, kept
  // until a generation has resharded them (an attempt that fails leaves them for the next).
  std::optional<ZeroHolding> zero_holding;
  // A pipeline job's recovery moved layers into this rank's model and failed before its engine
  // took them: its layers are of no known step until a generation's engine is built again.
  bool layers_unsure = false;
  std::shared_ptr<CheckpointWriter> checkpoints;
  std::future<std::string> pending_checkpoint;
  std::int64_t last_checkpoint_step = -1;
  std::string last_checkpoint_path;
};

// Writes a checkpoint when one is due after the step just completed: every checkpoint.every
// steps (in the background in async mode), or now when `final_or_requested`. Never twice for one
// step. No-op without checkpoint.dir. Returns whether it wrote (or started writing) one.
bool writeCheckpointIfDue(Trainer::State& s, bool final_or_requested);
// Waits for a background write in flight, if any; rethrows its error.
void finishPendingCheckpoint(Trainer::State& s);
// Restores the engine and the sampler from the checkpoint at `checkpoint_dir` (resharding ZeRO's
// slices when the world differs) and sets next_step to its step. Collective over the engine's
// world when the engine's restore is.
void restoreCheckpoint(Trainer::State& s, const std::string& checkpoint_dir);

// The launch rank whose device elastic member `member` runs on (State::slots; a launch member's
// own rank).
int slotOf(const Trainer::State& s, int member);

// Whether elastic recovery goes back to the last checkpoint (ZeRO's lost slices, a pipeline's lost
// stage): such a job writes one before its first step.
bool recoversFromCheckpoints(const Trainer::State& s);

// Elastic recovery (elastic_recovery.cc) after `failure`, a CommError of the current generation:
// agrees on the survivors with the others, rebuilds the engine for their plan from the state of
// the survivor that got furthest, and sets next_step to the step to redo. A ZeRO engine's lost
// slice exists nowhere else, nor a pipeline's lost stage: those rebuild from the last complete
// checkpoint instead (a pipeline re-cut over the survivors), and next_step goes back to that
// checkpoint's step. Tries again when
// another member is lost meanwhile. Throws CommError when this worker was left out, or (after a
// checkpoint, with checkpoint.dir) when fewer than elastic.min_devices are left.
void recoverFromLoss(Trainer::State& s, std::exception_ptr failure, const TrainerHooks& hooks);
// A worker that joins the running job (a replacement the agent started, WorkerIdentity::replaces):
// waits until the members admit it, then takes the plan and the state from them, as a member does
// after a loss, and sets next_step to the step they redo.
void joinRunningJob(Trainer::State& s, const ElasticOptions& options);
// A checkpoint writer for generation `generation`'s ranks (its own store keys), which gives a write
// up once that generation's world is aborted. No-op without checkpoint.dir.
void resetCheckpointWriter(Trainer::State& s, int generation);

}  // namespace chorus::runtime
