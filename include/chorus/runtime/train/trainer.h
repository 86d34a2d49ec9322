// The built-in trainer: one executor for every plan (data-parallel, pipeline, hybrid).
//
// It runs a plan::Plan (job_plan.h) on the worker's rank: the loop, the evaluations, the stop on
// request or at the target accuracy, checkpoints and resume are the same for every plan; what a
// plan's shape changes is the step engine it drives.
//
// One stage per replica (data parallelism): each step every rank takes its share b_i of the
// global batch (Σ b_i = B), runs it in micro-batches that fit its memory, back-propagates the sum
// of its samples' losses, and the GradientReducer all-reduces and divides by B — so the update
// equals single-device training on the global batch. After the step the ranks all-gather their
// compute times and run the same load balancer on them, so they agree on the next shares without
// a coordinator.
//
// S > 1 stages per replica (pipeline, hybrid): every rank is one (replica, stage) of a
// parallel::PipelineLayout (rank = replica · S + stage) and drives a parallel::PipelineEngine over
// its stage's layers; each replica takes a contiguous slice of the same global batch, the engine
// leaves the global-batch gradient (sum / B) in .grad, and the replicas' shares follow their
// measured step times through the same balancer policy. So training equals the data-parallel
// engine on one device, up to the summation order (invariant 1; tested).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chorus/device/speed_emulator.h"
#include "chorus/parallel/pipeline_layout.h"
#include "chorus/plan/plan.h"
#include "chorus/runtime/job/job_config.h"
#include "chorus/runtime/launch/worker.h"

namespace chorus::model {
class ZooModel;
}
namespace chorus::observe {
class TraceRecorder;
}

namespace chorus::runtime {

// One step as every rank saw it (identical on all ranks). Value type.
struct StepRecord {
  std::int64_t step = 0;
  double loss = 0;                // mean loss over the global batch
  double step_seconds = 0;        // wall time of the step on this rank
  double samples_per_second = 0;  // B / step_seconds
  double lr = 0;
  std::vector<std::int64_t> shares;     // per rank, the shares this step ran with
  std::vector<double> compute_seconds;  // per rank, padded compute time (what the balancer sees)
  std::vector<double> wait_seconds;     // per rank, time blocked on gradient all-reduce
  std::optional<double> test_accuracy;  // at evaluations
  std::optional<double> test_loss;
  std::string rebalance;  // the balancer's explanation when shares changed
  // A pipeline's cut moved after this step (parallel.recut), or a move's measured gain: why,
  // from where to where, predicted and measured (parallel/pipeline_recut.h). Else empty.
  std::string recut;
  // Mixed precision: whether the step was skipped because some rank's gradients overflowed
  // (every rank skips it), and the loss scale each rank ran the step with (0: it does not scale).
  bool skipped = false;
  std::vector<double> loss_scales;
  // Some rank was asked to stop (SIGTERM/SIGINT): every rank stops after this step.
  bool stop_requested = false;
};

// Summary of a run. Value type.
struct TrainResult {
  std::int64_t steps = 0;
  double wall_seconds = 0;
  double samples_per_second = 0;  // over the whole run
  double final_loss = 0;
  std::optional<double> test_accuracy;  // on the whole test split, at the end
  bool reached_target = false;
  bool interrupted = false;        // stopped early on request (TrainerHooks::stop_requested)
  std::int64_t skipped_steps = 0;  // steps skipped on gradient overflow
  std::string last_checkpoint;     // path of the newest checkpoint written (rank 0), or ""
};

// One elastic recovery as every survivor saw it (docs/elastic.md). Value type.
struct RecoveryRecord {
  int generation = 0;
  std::vector<int> members;  // launch ranks of the survivors; rank r is members[r]
  std::vector<int> lost;     // launch ranks left out
  std::vector<int> joined;   // members that joined (replacements of lost workers), by member id
  std::string reason;        // how the loss was noticed (the first report)
  std::int64_t step = 0;     // the step the survivors redo (or go on from)
  int source = -1;           // the survivor whose state they took
  std::vector<std::int64_t> shares;  // the survivors' shares, by new rank
  double agree_seconds = 0;          // from this worker's failure to the agreed membership
  double rebuild_seconds = 0;        // communicator, state handover and engine
};

struct TrainerHooks {
  // Called on every rank after each step. Default: none.
  std::function<void(const StepRecord&)> on_step;
  // elastic.enabled: called on every survivor after it recovered from a lost worker, before the
  // interrupted step is redone. Default: none.
  std::function<void(const RecoveryRecord&)> on_recovery;
  // Test hook of fault injection: called at named points of each step ("forward": before the
  // first micro-batch; "reduce": after the last backward, with gradient buckets in flight;
  // "optimizer": after every rank's figures arrived, before the optimizer steps; "recovery":
  // when an elastic recovery begins, with the step to redo; "regroup": a pipeline's, before its
  // layers move; "rebuild": a recovery's, before the next generation's engine is built;
  // "checkpoint": after a checkpoint of the step was written, or while an async one
  // is written). A test program kills or stops its own process there. Default: none.
  std::function<void(std::int64_t step, const char* point)> at_point;
  // Test hook: the emulated speed of this rank from a step on (1.0 = real speed); overrides the
  // device spec's speed. Default: none.
  std::function<double(std::int64_t step)> speed_at;
  // Polled once per step: true asks the job to stop (all ranks agree after the step), write a
  // checkpoint when checkpoint.dir is set, and return. The CLI connects it to SIGTERM/SIGINT.
  // Default: none.
  std::function<bool()> stop_requested;
  // Test hook: true makes this rank's gradients of that step non-finite (overflow consensus
  // tests). One stage per replica only: a pipeline refuses it (ConfigError). Default: none.
  std::function<bool(std::int64_t step)> inject_overflow;
  // Test hook: the seconds this rank reports to the load balancer for `step`, in which it ran
  // `samples` samples, instead of the measured ones, so that balancing tests are deterministic
  // (in a pipeline a replica's figure is the largest of its stages'). Default: none.
  std::function<double(std::int64_t step, std::int64_t samples)> balancer_seconds;
  // Test hook: a pipeline's cut to move to after `step` (cuts[0] = 0 < ... < cuts[S] = layers;
  // every rank must return the same), whatever parallel.recut says; empty keeps the cut. One
  // stage per replica has no cut: the data-parallel engine refuses it (ConfigError). Default:
  // none.
  std::function<std::vector<int>(std::int64_t step)> cut_at;
  // Records a timeline of the steps it covers: per micro-batch forward and backward, the padding
  // of an emulated device, each gradient bucket's all-reduce, the step's figures, the optimizer,
  // evaluations and checkpoints. Not owned; must outlive the calls it is passed to. One stage per
  // replica only: a pipeline refuses it (ConfigError). Default: null, nothing recorded.
  observe::TraceRecorder* trace = nullptr;
};

// One rank of a job: owns the job's data, the model (all of it is built with the job's seed; a
// pipeline stage trains only its layers), the step engine with its optimizer, reducer and
// balancer, and the checkpoint writer. Used by one thread. Non-copyable. The constructor, step(),
// run(), evaluate(), checkpoint() and resume() are collective: every rank of the job calls them,
// in the same order.
class Trainer {
 public:
  // Runs `plan` (job_plan.h; rank order): its shares are where the balancer starts (fixed when
  // balancer.shares is set or balance = "off"); its precision and micro-batch per rank, its cut,
  // schedule and activation checkpointing are this rank's. Throws ConfigError when the plan is not
  // one for this world and this rank's device, or its cut does not fit the model.
  Trainer(JobConfig job, plan::Plan plan, std::shared_ptr<Worker> worker);
  // The plan of `job` as written (planOfJob), every rank's device all-gathered; collective. For
  // programs that build a trainer themselves.
  Trainer(JobConfig job, std::shared_ptr<Worker> worker);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains for job.train.steps steps (or until the target accuracy), evaluating every
  // train.eval_every steps and at the end; checkpoints as [checkpoint] says. With
  // elastic.enabled, a lost worker does not end it: the survivors recover and go on
  // (docs/elastic.md), and rank(), worldSize() and world() of the worker change.
  TrainResult run(const TrainerHooks& hooks = {});
  // Runs one step (the next one); exposed for tests that compare step by step.
  // StepRecord::shares and compute_seconds hold one entry per rank (in a pipeline: the share of
  // the rank's replica and the rank's forward + backward time).
  StepRecord step(const TrainerHooks& hooks = {});
  // Accuracy and mean loss on the first `samples` test samples (0: the whole test split; -1:
  // train.eval_samples), identical on all ranks.
  std::pair<double, double> evaluate(std::int64_t samples = -1);

  // Writes a checkpoint of the state after the last completed step into checkpoint.dir (every
  // rank calls it at the same step) and waits for it; returns its path. Throws ConfigError
  // without checkpoint.dir.
  std::string checkpoint();
  // Continues from a checkpoint directory (verified; see resolveCheckpoint). One stage per
  // replica: the device set may differ from the one that wrote it (the batch sequence goes on,
  // the shares are re-planned). A pipeline needs the layout (stages, replicas, cuts) that wrote
  // it and resumes bitwise. Call before the first step. Throws CheckpointError.
  void resume(const std::string& checkpoint_dir);
  // The step the next step() runs.
  std::int64_t nextStep() const;
  // elastic.enabled: whether the job has gone on without this worker's generation (it was lost
  // and came back, or a recovery is under way); asks the store. False without elastic.
  bool superseded() const;

  // The plan as it runs now. This rank's (replica, stage): (rank, 0) for data parallelism.
  parallel::StagePosition position() const;
  // cuts[0] = 0 < … < cuts[S] = the model's layers; stage s runs [cuts[s], cuts[s+1]).
  const std::vector<int>& cuts() const;
  // Samples of each global batch per replica (per rank for data parallelism), for the next step.
  const std::vector<std::int64_t>& shares() const;
  // The parameters this rank trains (its stage's in a pipeline), in the model's order. Under
  // ZeRO-3 their storage is empty between steps: read them with parameterValues(). Throws
  // CommError after a ZeRO step whose parameter all-gather lost a rank (zero.redundancy = 1), as
  // parameterValues() does, until the recovery has gathered them again.
  const std::vector<at::Tensor>& parameters() const;
  // Copies of parameters()' values; under ZeRO-3 gathered from every rank's slice, so collective
  // (every rank calls it) and this rank holds the whole model while they live.
  std::vector<at::Tensor> parameterValues();
  // This rank's compute precision and its loss scale (0 when it does not scale).
  std::string precision() const;
  double lossScale() const;
  // The whole model; only this rank's stage is trained here in a pipeline.
  model::ZooModel& model();
  // Running totals of the speed emulator this rank's compute runs under now (the device's, or
  // the one TrainerHooks::speed_at set), for metrics and for tests of how it is padded.
  device::EmulationTotals emulationTotals() const;

  struct State;  // opaque; defined in src/runtime/trainer_state.h

 private:
  std::unique_ptr<State> state_;
};

}  // namespace chorus::runtime
