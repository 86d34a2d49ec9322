// The executor: one loop for every plan — steps, evaluations, the stop on request or at the
// target accuracy, periodic and final checkpoints, the final whole-split evaluation — around the
// step engine the plan's shape calls for.
#include "chorus/runtime/train/trainer.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "chorus/core/clock.h"
#include "chorus/core/error.h"
#include "chorus/core/logging.h"
#include "chorus/observe/trace_recorder.h"
#include "chorus/runtime/job/job_plan.h"
#include "chorus/runtime/train/world_plan.h"
#include "train/joined_device.h"
#include "train/trainer_state.h"

namespace chorus::runtime {
namespace {

using TraceClock = observe::TraceRecorder::Clock;

// What every engine needs of a plan before the collective start: one rank per worker, and this
// rank's device the one the plan was made for. A rank that threw only after startTraining would
// leave the others waiting in its broadcast.
void checkPlanForWorld(const plan::Plan& plan, const Worker& worker) {
  CHORUS_CHECK_CONFIG(static_cast<int>(plan.ranks.size()) == worker.worldSize(),
                      "trainer: a plan of ", plan.ranks.size(), " ranks in a job of ",
                      worker.worldSize());
  const plan::RankPlan& mine = plan.ranks.at(worker.rank());
  CHORUS_CHECK_CONFIG(plan::jobDevice(mine) == worker.identity().device, "trainer: rank ",
                      worker.rank(), " was planned for '", mine.device_type, "' but runs on '",
                      worker.identity().device.toString(), "'");
}

// A replacement worker (WorkerIdentity::replaces) takes the launch plan's entry of the rank it
// replaces: it must run on that rank's device, in an elastic job.
void checkPlanForJoiner(const JobConfig& job, const plan::Plan& plan, const Worker& worker) {
  const int replaces = worker.identity().replaces;
  CHORUS_CHECK_CONFIG(job.elastic.enabled, "trainer: rank ", worker.member(), " replaces rank ",
                      replaces, ", but the job is not elastic");
  CHORUS_CHECK_CONFIG(replaces < static_cast<int>(plan.ranks.size()), "trainer: rank ",
                      worker.member(), " replaces rank ", replaces, " of a plan of ",
                      plan.ranks.size(), " ranks");
  const plan::RankPlan& slot = plan.ranks.at(replaces);
  CHORUS_CHECK_CONFIG(plan::jobDevice(slot) == worker.identity().device, "trainer: rank ", replaces,
                      " was planned for '", slot.device_type, "', but rank ", worker.member(),
                      ", which replaces it, runs on '", worker.identity().device.toString(), "'");
}

ElasticOptions elasticOptions(const JobConfig& job, const Worker& worker) {
  ElasticOptions options;
  options.heartbeat = std::chrono::milliseconds(job.elastic.heartbeat_ms);
  options.misses = static_cast<int>(job.elastic.heartbeat_misses);
  options.agreement_timeout = std::chrono::milliseconds(worker.identity().timeout_ms);
  return options;
}

// Elastic recovery of ZeRO and of pipelines goes back to the last checkpoint, so they need
// somewhere to write them; a plan given with --plan may differ from the job's own settings, which
// the job's checks saw.
void checkElasticPlan(const JobConfig& job, const plan::Plan& plan) {
  if (!job.elastic.enabled) return;
  CHORUS_CHECK_CONFIG(plan.stageCount() == 1 || !job.checkpoint.dir.empty(),
                      "elastic.enabled: the plan has ", plan.stageCount(),
                      " stages per replica, whose lost layers come back only from a checkpoint: "
                      "set checkpoint.dir");
  CHORUS_CHECK_CONFIG(plan.zero_stage == 0 || !job.checkpoint.dir.empty(),
                      "elastic.enabled: the plan shards with ZeRO stage ", plan.zero_stage,
                      ", whose lost slices come back only from a checkpoint: set checkpoint.dir");
}

// Runs `body`; with elastic recovery, a CommError (a lost worker) is recovered from and `body`
// runs again, in the new generation, from the step the survivors agreed on.
template <typename Body>
void elastically(Trainer::State& s, const TrainerHooks& hooks, Body&& body) {
  for (;;) {
    try {
      body();
      return;
    } catch (const CommError&) {
      if (!s.membership) throw;
      recoverFromLoss(s, std::current_exception(), hooks);
    }
  }
}

// Runs `body`, recording it on the timeline as `name` when one records.
template <typename Body>
auto traced(observe::TraceRecorder* trace, const char* name, Body&& body) {
  const auto start = TraceClock::now();
  auto result = body();
  if (trace != nullptr) trace->span(observe::Track::kCompute, name, name, start, TraceClock::now());
  return result;
}

}  // namespace

std::pair<double, double> evaluationResult(const at::Tensor& totals) {
  const double correct = totals[0].item<double>(), predictions = totals[1].item<double>();
  const double loss = totals[2].item<double>(), samples = totals[3].item<double>();
  return {predictions > 0 ? correct / predictions : 0.0, samples > 0 ? loss / samples : 0.0};
}

Trainer::Trainer(JobConfig job, std::shared_ptr<Worker> worker)
    : Trainer(job, planOfWorld(job, *worker), worker) {}

Trainer::Trainer(JobConfig job, plan::Plan plan, std::shared_ptr<Worker> worker)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  const bool joining = worker->identity().joins();
  if (worker->identity().new_device)
    checkNewDeviceJoin(job, plan, *worker);
  else if (joining)
    checkPlanForJoiner(job, plan, *worker);
  else
    checkPlanForWorld(plan, *worker);
  checkElasticPlan(job, plan);
  s.context = startTraining(std::move(job), std::move(worker), /*share_parameters=*/!joining);
  TrainingContext& c = *s.context;
  s.plan = plan;
  s.launch_plan = plan;
  if (joining) {
    joinRunningJob(s, elasticOptions(c.job, *c.worker));
  } else {
    s.engine =
        plan.stageCount() > 1 ? makePipelineStageEngine(c, plan) : makeDataParallelEngine(c, plan);
  }
  if (c.job.elastic.enabled && !joining) {
    // Every rank starts watching its peers' heartbeats at the same moment: a rank whose engine
    // took longer to build (a memory calibration, say) must not look hung to the others.
    c.worker->world()->barrier().wait();
    s.membership = std::make_unique<ElasticMembership>(c.worker, elasticOptions(c.job, *c.worker));
    s.engine_members = s.membership->current().members;
  }
  if (!c.job.checkpoint.dir.empty()) {
    CheckpointOptions options;
    options.root = c.job.checkpoint.dir;
    options.keep = static_cast<int>(c.job.checkpoint.keep);
    s.checkpoints = std::make_shared<CheckpointWriter>(options, c.worker->store(), c.worker->rank(),
                                                       c.worker->worldSize());
    if (s.membership) resetCheckpointWriter(s, s.membership->current().number);
  }
}

Trainer::~Trainer() {
  // A background checkpoint must not outlive the state it writes from.
  if (state_ && state_->pending_checkpoint.valid()) {
    try {
      state_->pending_checkpoint.get();
    } catch (const std::exception& error) {
      logWarn("checkpoint: background write failed: ", error.what());
    }
  }
}

StepRecord Trainer::step(const TrainerHooks& hooks) {
  // Counted once it completed: a step cut short by a lost worker is redone (elastic recovery).
  StepRecord record = state_->engine->step(state_->next_step, hooks);
  ++state_->next_step;
  if (hooks.on_step) hooks.on_step(record);
  return record;
}

std::pair<double, double> Trainer::evaluate(std::int64_t samples) {
  return state_->engine->evaluate(samples);
}

TrainResult Trainer::run(const TrainerHooks& hooks) {
  State& s = *state_;
  const JobConfig& job = s.context->job;
  const TrainSection& train = job.train;
  // Evaluations and checkpoints go on the timeline of the step they follow.
  observe::TraceRecorder* trace = hooks.trace;
  const auto checkpoint = [&](bool final_or_requested) {
    const auto start = TraceClock::now();
    if (!writeCheckpointIfDue(s, final_or_requested)) return;
    if (trace != nullptr)
      trace->span(observe::Track::kCompute, "checkpoint", "checkpoint", start, TraceClock::now());
    if (hooks.at_point) hooks.at_point(s.next_step - 1, "checkpoint");
  };
  TrainerHooks inner = hooks;
  inner.on_step = nullptr;  // called below, after any evaluation joined the record
  TrainResult result;
  Stopwatch clock;
  std::int64_t samples = 0;
  // Elastic recovery brings a lost rank's ZeRO slice or pipeline stage back from the last
  // checkpoint: there must be one from the start. A worker that joined finds one written (the
  // members are past it).
  if (s.membership && recoversFromCheckpoints(s) && !s.context->worker->identity().joins())
    elastically(s, hooks, [&] { checkpoint(true); });
  while (s.next_step < train.steps) {
    StepRecord record;
    elastically(s, hooks, [&] { record = step(inner); });
    samples += train.global_batch;
    const std::int64_t done = s.next_step;
    if ((train.eval_every > 0 && done % train.eval_every == 0) || done == train.steps) {
      // Survivors of a loss during the evaluation are all past this step (it needed every
      // rank's reduction): they evaluate its model again.
      elastically(s, hooks, [&] {
        const auto [accuracy, loss] = traced(trace, "evaluation", [&] { return evaluate(-1); });
        record.test_accuracy = accuracy;
        record.test_loss = loss;
      });
    }
    // Every rank decides the same change; one of them says so.
    if (!record.rebalance.empty() && s.context->worker->rank() == 0)
      logInfo("balancer: ", record.rebalance);
    if (!record.recut.empty() && s.context->worker->rank() == 0) logInfo("recut: ", record.recut);
    if (hooks.on_step) hooks.on_step(record);
    result.final_loss = record.loss;
    result.steps = done;
    if (record.stop_requested) {
      result.interrupted = true;
      break;
    }
    if (train.target_accuracy > 0 && record.test_accuracy &&
        *record.test_accuracy >= train.target_accuracy) {
      result.reached_target = true;
      break;
    }
    elastically(s, hooks, [&] { checkpoint(false); });
  }
  // The state after the last step: at the end (when configured), or when asked to stop.
  elastically(s, hooks, [&] {
    checkpoint(result.interrupted || job.checkpoint.at_end);
    finishPendingCheckpoint(s);
  });
  result.last_checkpoint = s.last_checkpoint_path;
  if (!result.interrupted) elastically(s, hooks, [&] { result.test_accuracy = evaluate(0).first; });
  // A node that asks to join now would wait for an agreement that never comes.
  if (s.membership) s.membership->finish(detail::concat("after step ", s.next_step));
  result.skipped_steps = s.engine->skippedSteps();
  result.wall_seconds = clock.seconds();
  result.samples_per_second = samples / std::max(result.wall_seconds, 1e-9);
  return result;
}

std::int64_t Trainer::nextStep() const { return state_->next_step; }

bool Trainer::superseded() const { return state_->membership && state_->membership->superseded(); }

parallel::StagePosition Trainer::position() const { return state_->engine->position(); }

const std::vector<int>& Trainer::cuts() const { return state_->engine->cuts(); }

const std::vector<std::int64_t>& Trainer::shares() const { return state_->engine->shares(); }

const std::vector<at::Tensor>& Trainer::parameters() const { return state_->engine->parameters(); }

std::vector<at::Tensor> Trainer::parameterValues() { return state_->engine->parameterValues(); }

std::string Trainer::precision() const { return plan::toString(state_->engine->precision()); }

double Trainer::lossScale() const { return state_->engine->lossScale(); }

model::ZooModel& Trainer::model() { return *state_->context->model; }

device::EmulationTotals Trainer::emulationTotals() const {
  return state_->engine->emulationTotals();
}

}  // namespace chorus::runtime
