// The built-in trainer for pipeline and hybrid (replicas × stages) parallelism.
//
// `chorus train` runs it when [parallel] pipeline_stages > 1. Every worker is one (replica, stage)
// of a parallel::PipelineLayout (rank = replica · S + stage) and drives a parallel::PipelineEngine
// over its stage's layers. All ranks derive the same plan without a coordinator: the devices'
// specs (speed, memory budget) are all-gathered, the cut comes from parallel::stageCuts, and each
// replica's share of the global batch starts proportional to the rate of its slowest stage under
// that cut; then the job's load balancer (`balance`: off | static | adaptive, as for data
// parallelism) moves samples between replicas by their measured step times, every rank deciding
// the same from all-gathered figures. A step takes the sampler's global batch (the same sequence as
// runtime::Trainer), gives each replica its contiguous slice, runs the schedule, steps the
// optimizer over the stage's parameters (the engine leaves the global-batch gradient, sum / B, in
// .grad), and all-gathers the per-rank figures so every rank returns the same StepRecord. So
// training equals runtime::Trainer on one device, up to the summation order (invariant 1; tested).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chorus/core/device_spec.h"
#include "chorus/parallel/pipeline_layout.h"
#include "chorus/plan/plan.h"
#include "chorus/runtime/job_config.h"
#include "chorus/runtime/trainer.h"
#include "chorus/runtime/worker.h"

namespace chorus::runtime {

// The engine's options for `job` ([parallel] and train.global_batch; replica_shares left empty).
// Throws ConfigError on a bad schedule or checkpointing name.
parallel::PipelineOptions pipelineOptions(const JobConfig& job);

// The devices of a pipeline job's ranks (rank = replica · S + stage) as the cut sees them,
// [replica][stage]: speed and memory budget (0: none). Throws ConfigError on a count that does not
// fit the layout.
std::vector<std::vector<parallel::StageDevice>> stageDevices(
    const parallel::PipelineLayout& layout, const std::vector<DeviceSpec>& devices);

// Each replica's share of the global batch: proportional to 1 / max over its stages of (the
// stage's work per sample under `cuts`) / (its device's speed), each at least micro_batches.
// `devices[replica][stage]`. Pure; every rank computes the same.
std::vector<std::int64_t> pipelineReplicaShares(
    const parallel::PipelineOptions& options, const std::vector<model::LayerProfile>& profile,
    const std::vector<int>& cuts, const std::vector<std::vector<parallel::StageDevice>>& devices);

// The most samples each replica may take per step under its devices' memory budgets: the largest
// share whose micro-batches (ceil(share / micro_batches) samples) every stage of the replica holds
// within its budget by the job's memory model (memoryModelForBudgets), the model the cut is
// checked with. 0 for a replica without budgets (no limit; `memory` may then be null). The load
// balancer never moves a share above it. Pure.
std::vector<std::int64_t> pipelineShareCaps(
    const parallel::PipelineOptions& options,
    const std::shared_ptr<const plan::MemoryModel>& memory, const std::vector<int>& cuts,
    const std::vector<std::vector<parallel::StageDevice>>& devices);

// Checks a pipeline job against the devices it will run on (rank k on devices[k]), before any
// worker starts: the device count, the data files and the global batch (as validateJobOnDevices,
// without its whole-model memory check), the partition against the model's layers, and that a cut
// fits every memory budget. Throws ConfigError.
void validatePipelineJob(const JobConfig& job, const std::vector<DeviceSpec>& devices);

// One rank's stage of a pipeline job: owns the model (all of it is built with the job's seed;
// only the stage's layers train here), the engine, the optimizer over the stage's parameters, the
// datasets, the sampler and the checkpoint writer. Used by one thread. Non-copyable. The
// constructor, step(), evaluate(), checkpoint() and resume() are collective: every rank of the
// job calls them, in the same order.
class PipelineTrainer {
 public:
  // Runs `plan` (job_plan.h; rank order, S > 1 stages per replica): its cut, replica start shares,
  // micro-batches, schedule and checkpointing. Throws ConfigError when the plan is not one for
  // this world and this rank's device.
  PipelineTrainer(JobConfig job, plan::Plan plan, std::shared_ptr<Worker> worker);
  // The plan of `job` as written (planOfJob), every rank's device all-gathered; collective.
  // Throws ConfigError when the world size is not pipeline_stages × replicas, or the cut does not
  // fit the model or the devices.
  PipelineTrainer(JobConfig job, std::shared_ptr<Worker> worker);
  ~PipelineTrainer();
  PipelineTrainer(const PipelineTrainer&) = delete;
  PipelineTrainer& operator=(const PipelineTrainer&) = delete;

  // Trains to train.steps (or the target accuracy), evaluating every train.eval_every steps and
  // at the end; checkpoints as [checkpoint] says. Honours hooks.on_step, stop_requested, speed_at
  // and balancer_seconds (inject_overflow is Trainer-only).
  TrainResult run(const TrainerHooks& hooks = {});
  // Runs the next step. StepRecord::shares and compute_seconds hold one entry per rank: the share
  // of the rank's replica (the one this step ran with) and the rank's forward + backward time
  // (emulation padding included); wait_seconds its time blocked on transfers and the
  // cross-replica all-reduce; rebalance the balancer's line when the shares change after it.
  StepRecord step(const TrainerHooks& hooks = {});
  // Accuracy and mean loss on the first `samples` test samples (0: all; -1: train.eval_samples),
  // forward only through the pipeline, the samples dealt to the replicas. Same on every rank.
  std::pair<double, double> evaluate(std::int64_t samples = -1);

  // Writes a checkpoint of the state after the last completed step (every rank at the same step)
  // and returns its path: per rank "stage-<s>-replica-<r>-{model,optimizer,rng}.pt", and
  // trainer.json from rank 0. Throws ConfigError without checkpoint.dir.
  std::string checkpoint();
  // Continues from a checkpoint written by a job of the same layout (stages, replicas, cuts) and
  // problem (seed, global batch, model), with the replica shares and load balancer state it saved;
  // bitwise the run that wrote it. Call before the first step. Throws CheckpointError.
  void resume(const std::string& checkpoint_dir);

  std::int64_t nextStep() const;
  parallel::StagePosition position() const;
  // cuts[0] = 0 < … < cuts[S] = the model's layers; stage s runs [cuts[s], cuts[s+1]).
  const std::vector<int>& cuts() const;
  // Samples of each global batch per replica, for the next step.
  const std::vector<std::int64_t>& replicaShares() const;
  // The whole model; only this stage's layers are trained here.
  model::ZooModel& model();
  // This stage's trainable parameters, in the model's order.
  const std::vector<at::Tensor>& stageParameters() const;

  struct State;  // opaque; defined in src/runtime/pipeline_trainer_state.h

 private:
  std::unique_ptr<State> state_;
};

}  // namespace chorus::runtime
