// The pipeline engine's construction (the plan's cut, schedule, replica shares and the balancer
// over them) and its step: the replica's slice of the global batch through the stage's schedule,
// the optimizer over the stage's parameters, the figures every rank shares.
#include <ATen/ATen.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <sstream>

#include "chorus/core/clock.h"
#include "chorus/core/error.h"
#include "chorus/core/logging.h"
#include "chorus/core/units.h"
#include "chorus/device/speed_emulator.h"
#include "chorus/observe/trace_recorder.h"
#include "chorus/runtime/job/job_plan.h"
#include "chorus/runtime/job/memory_calibration.h"
#include "chorus/runtime/job/pipeline_job.h"
#include "chorus/runtime/train/step_figures.h"
#include "job/balancer_settings.h"
#include "train/engine_settings.h"
#include "train/pipeline_stage_engine.h"

namespace chorus::runtime {
namespace {

// Every rank's device as the plan names it.
std::vector<DeviceSpec> planDevices(const plan::Plan& plan) {
  std::vector<DeviceSpec> devices;
  for (const plan::RankPlan& rank : plan.ranks) devices.push_back(plan::jobDevice(rank));
  return devices;
}

// The engine's options for `plan` (rank order): its layout, micro-batches, schedule and
// checkpointing; the rest from the job. A plan that checkpoints uses the job's mode, or keeps
// layer outputs (the planner's meaning) when the job names none.
parallel::PipelineOptions pipelineOptionsOf(const JobConfig& job, const plan::Plan& plan) {
  CHORUS_CHECK_CONFIG(plan.stageCount() > 1,
                      "pipeline: a plan of one stage per replica is run by "
                      "the data-parallel engine");
  parallel::PipelineOptions options = pipelineOptions(job);
  options.pipeline_stages = plan.stageCount();
  options.replicas = static_cast<int>(plan.replicas.size());
  options.micro_batches = plan.micro_batches;
  options.schedule = plan.schedule;
  options.activation_checkpointing = plannedCheckpointing(plan, options.activation_checkpointing);
  return options;
}

// `formats`: every rank's compute format, when not all are fp32.
std::string describePlan(const PipelineStageEngine& s, const std::vector<std::string>& formats) {
  std::ostringstream text;
  text << "pipeline: " << s.options.pipeline_stages << " stages x " << s.options.replicas
       << " replica(s), " << plan::toString(s.options.schedule) << ", " << s.options.micro_batches
       << " micro-batches, checkpointing " << plan::toString(s.options.activation_checkpointing)
       << "; layers per stage";
  for (std::size_t i = 0; i + 1 < s.stage_cuts.size(); ++i)
    text << (i ? " + " : " ") << s.stage_cuts[i + 1] - s.stage_cuts[i];
  text << " (cut " << s.options.partition << "); replica shares";
  for (std::size_t r = 0; r < s.options.replica_shares.size(); ++r)
    text << (r ? ", " : " ") << s.options.replica_shares[r];
  if (s.balancer->active()) text << " (balance " << s.job.balancer.mode << ")";
  if (!formats.empty()) {
    text << "; stages compute in";
    for (std::size_t r = 0; r < formats.size(); ++r) text << (r ? ", " : " ") << formats[r];
    text << ", activations cross in " << (s.options.fp32_transfers ? "fp32" : "the sender's");
  }
  return text.str();
}

// Every rank's compute format by rank, or none when all compute in fp32.
std::vector<std::string> rankFormats(const plan::Plan& plan) {
  std::vector<std::string> formats;
  bool mixed = false;
  for (const plan::RankPlan& rank : plan.ranks) {
    formats.push_back(precisionName(rank));
    mixed = mixed || formats.back() != "fp32";
  }
  return mixed ? formats : std::vector<std::string>{};
}

// Each replica's time for its share, for the balancer: the largest schedule time of its stages,
// i.e. the replica's step up to the cross-replica all-reduce. Why not the stages' compute: a
// replica's throughput is set by its whole pipeline (Σ of its stages' times plus (M − 1) × the
// slowest, bubbles and transfers included), not by its slowest stage alone, and unlike replicas
// differ in that ratio. The all-reduce is left out because every replica waits in it for the
// slowest one: it would add the same time to every figure and hide which replica is slow.
std::vector<double> replicaSeconds(const StepFigures& figures,
                                   const parallel::PipelineLayout& layout) {
  std::vector<double> seconds(layout.replicas(), 0.0);
  const std::vector<double> balance = figures.balance();
  for (int rank = 0; rank < static_cast<int>(balance.size()); ++rank) {
    double& replica = seconds[layout.positionOf(rank).replica];
    replica = std::max(replica, balance[rank]);
  }
  return seconds;
}

using TraceClock = observe::TraceRecorder::Clock;

// The step's program on the timeline: each forward and backward on the compute track, each
// receive's wait and the replicas' all-reduce on the communication track.
void traceSchedule(observe::TraceRecorder& trace, const parallel::PipelineStepStats& stats) {
  for (const parallel::ActionSpan& span : stats.spans) {
    const std::string m = std::to_string(span.micro_batch);
    switch (span.kind) {
      case parallel::ActionKind::kForward:
        trace.span(observe::Track::kCompute, "forward " + m, "compute", span.start, span.end);
        break;
      case parallel::ActionKind::kBackward:
        trace.span(observe::Track::kCompute, "backward " + m, "compute", span.start, span.end);
        break;
      case parallel::ActionKind::kRecvActivation:
        trace.span(observe::Track::kComm, "recv activation " + m, "p2p", span.start, span.end);
        break;
      case parallel::ActionKind::kRecvGradient:
        trace.span(observe::Track::kComm, "recv gradient " + m, "p2p", span.start, span.end);
        break;
      default:
        break;
    }
  }
  if (stats.sync_end > stats.sync_start)
    trace.span(observe::Track::kComm, "all_reduce replicas", "allreduce", stats.sync_start,
               stats.sync_end);
}

// TrainerHooks::speed_at: a new emulator when the speed changes, which the engine pads with from
// this step on.
void applySpeedHook(PipelineStageEngine& s, const TrainerHooks& hooks, std::int64_t step) {
  if (!hooks.speed_at) return;
  const double speed = hooks.speed_at(step);
  if (speed == s.speed) return;
  s.speed_override = s.worker->makeEmulator(s.speed = speed);
  s.speed_override->yieldCoreToFasterDevices();
  s.engine->setEmulator(s.speed_override.get());
}

}  // namespace

PipelineStageEngine::PipelineStageEngine(TrainingContext& context, const plan::Plan& plan)
    : job(context.job),
      worker(context.worker),
      data(context.data),
      sampler(context.sampler),
      model(context.model) {
  PipelineStageEngine& s = *this;
  comm::Communicator& world = *s.worker->world();
  CHORUS_CHECK_CONFIG(plan.zero_stage == 0, "pipeline: ZeRO stage ", plan.zero_stage,
                      " shards one-stage replicas only, not pipeline stages");
  s.options = pipelineOptionsOf(s.job, plan);
  s.global_batch = plan.global_batch;
  const parallel::PipelineLayout layout(s.options.replicas, s.options.pipeline_stages);
  CHORUS_CHECK_CONFIG(world.size() == layout.worldSize(), "pipeline: a plan of ", layout.stages(),
                      " stages x ", layout.replicas(), " replicas needs ", layout.worldSize(),
                      " ranks, the job has ", world.size());
  s.options.precision = computePrecision(plan.ranks.at(world.rank()));
  parallel::allowTf32(s.job.precision.tf32, s.job.precision.conv_tf32);
  for (const plan::StagePlan& stage : plan.replicas.at(0).stages)
    s.stage_cuts.push_back(stage.first_layer);
  s.stage_cuts.push_back(plan.replicas[0].stages.back().last_layer);
  for (const plan::ReplicaPlan& replica : plan.replicas)
    s.options.replica_shares.push_back(replica.share);
  const std::vector<DeviceSpec> devices = planDevices(plan);
  // The plan's memory profile, not a new measurement: the caps and the adaptive cut share it.
  const auto memory = planMemoryModelForBudgets(s.job, plan, devices);
  s.balancer = std::make_unique<ReplicaBalancer>(
      balancerOptions(s.job.balancer), s.options.replica_shares, s.options.micro_batches,
      pipelineShareCaps(s.options, memory, s.stage_cuts, stageDevices(layout, devices)));
  s.speed = s.worker->identity().device.speed;
  s.comm = plan.comm;
  s.codec = planCodec(s.comm);
  s.engine = std::make_unique<parallel::PipelineEngine>(s.model, s.options, s.stage_cuts,
                                                        engineResources(nullptr));
  s.holdStageLayersOnly();
  s.optimizer = makeOptimizer(s.job.optimizer, s.engine->parameters());
  if (parallel::needsLossScaling(s.options.precision)) {
    const DeviceSpec& device = s.worker->identity().device;
    s.scaler.emplace(lossScalerOptions(
        s.job.precision, device.kind,
        device.kind == DeviceKind::kCuda ? cudaComputeCapability(device.index) : ""));
  }
  attachUnscaler();
  s.recut = std::make_unique<PipelineRecut>(s, devices, memory);
  if (world.rank() == 0) logInfo(describePlan(s, rankFormats(plan)));
  // Data and model are in place: from here on a budget counts what training allocates.
  if (s.worker->identity().device.memory_budget) {
    // The start shares' largest micro-batch: the balancer may raise a share only within the caps
    // the budgets allow, so evaluation chunks of this size fit wherever training fits.
    const auto& shares = s.options.replica_shares;
    const std::int64_t largest = *std::max_element(shares.begin(), shares.end());
    s.eval_chunk = (largest + s.options.micro_batches - 1) / s.options.micro_batches;
    s.worker->enforceMemoryBudget();
  }
}

parallel::PipelineResources PipelineStageEngine::engineResources(
    const parallel::PipelineEngine* previous) const {
  parallel::PipelineResources resources;
  resources.world = worker->world();
  resources.emulator = speed_override ? speed_override.get() : &worker->emulator();
  resources.replica_sync = reducerBuckets(comm);
  resources.replica_sync.codec = codec;
  if (previous != nullptr) {
    resources.stage_group = previous->stageGroup();
    resources.replica_sync.hierarchical = previous->replicaSyncEngine();
  }
  return resources;
}

void PipelineStageEngine::attachUnscaler() {
  unscaler.reset();  // its hooks off the parameters of the last cut first
  if (scaler) unscaler = std::make_unique<parallel::GradientUnscaler>(engine->parameters());
}

StepRecord PipelineStageEngine::step(std::int64_t step, const TrainerHooks& hooks) {
  PipelineStageEngine& s = *this;
  comm::Communicator& world = *s.worker->world();
  applySpeedHook(s, hooks, step);
  if (hooks.trace != nullptr) hooks.trace->setStep(step);
  observe::TraceRecorder* trace =
      hooks.trace != nullptr && hooks.trace->recording() ? hooks.trace : nullptr;
  Stopwatch clock;
  StepRecord record;
  record.step = step;
  record.lr = learningRateAt(s.job.optimizer, step, s.job.train.steps);
  setLearningRate(*s.optimizer, record.lr);

  // This replica's contiguous slice of the global batch; only the ends of the pipe read data.
  const std::vector<std::int64_t>& shares = s.options.replica_shares;
  const int replica = s.position().replica;
  std::int64_t offset = 0;
  for (int r = 0; r < replica; ++r) offset += shares[r];
  at::Tensor inputs, targets;
  if (s.firstStage() || s.lastStage()) {
    const std::vector<std::int64_t> ids = s.sampler->batch(step);
    const data::Batch batch = s.data.train->get(
        std::vector<std::int64_t>(ids.begin() + offset, ids.begin() + offset + shares[replica]));
    if (s.firstStage()) inputs = batch.inputs.to(s.worker->device());
    if (s.lastStage()) targets = batch.targets.to(s.worker->device());
  }
  s.model->train();
  parallel::StepScaling scaling;
  if (s.scaler) scaling.loss_scale = s.scaler->scale();
  scaling.inject_overflow = hooks.inject_overflow && hooks.inject_overflow(step);
  if (s.unscaler) s.unscaler->beginStep(scaling.loss_scale);
  if (hooks.at_point) hooks.at_point(step, "forward");
  const parallel::PipelineStepStats stats = s.engine->step(inputs, targets, scaling);
  const bool overflow = !stats.gradients_finite || (s.unscaler && s.unscaler->overflowed());
  if (trace != nullptr) traceSchedule(*trace, stats);
  const auto figures_start = TraceClock::now();

  const bool stop = hooks.stop_requested && hooks.stop_requested();
  const double balance = hooks.balancer_seconds ? hooks.balancer_seconds(step, shares[replica])
                                                : stats.schedule_seconds;
  RankFigures reported;
  reported.compute_seconds = stats.compute_seconds;
  reported.wait_seconds = stats.transfer_wait_seconds + stats.sync_seconds;
  reported.loss_sum = stats.loss_sum;  // only last stages compute a loss
  reported.overflow = overflow;
  reported.stop = stop;
  reported.loss_scale = s.scaler ? s.scaler->scale() : 0.0;
  reported.balance = balance;
  reported.samples = s.engine->layout().positionOf(world.rank()).stage == 0 ? shares[replica] : 0;
  const StepFigures figures = StepFigures::exchange(world, reported, /*always=*/true);
  if (trace != nullptr)
    trace->span(observe::Track::kComm, "step figures", "sync", figures_start, TraceClock::now());
  const parallel::PipelineLayout& layout = s.engine->layout();
  for (int rank = 0; rank < world.size(); ++rank)
    record.shares.push_back(shares[layout.positionOf(rank).replica]);
  record.compute_seconds = figures.computeSeconds();
  record.wait_seconds = figures.waitSeconds();
  record.loss_scales = figures.lossScales();
  record.stop_requested = figures.anyStop();
  record.skipped = figures.anyOverflow();
  const double loss_sum = figures.lossSum();
  // Overflow consensus: an overflow on any stage of any replica skips the step everywhere (a
  // stage stepping alone would leave its replicas' parameters apart), and every fp16 stage backs
  // off its scale.
  if (hooks.at_point) hooks.at_point(step, "optimizer");
  const auto optimizer_start = TraceClock::now();
  if (record.skipped)
    ++s.skipped_steps;
  else
    s.optimizer->step();
  if (trace != nullptr)
    trace->span(observe::Track::kCompute, "optimizer", "optimizer", optimizer_start,
                TraceClock::now());
  if (s.scaler) s.scaler->update(record.skipped);
  record.loss = loss_sum / static_cast<double>(s.global_batch);
  // Step 0 pays one-time costs (allocations, caches) that would mislead the balancer's fit, as
  // in the data-parallel trainer. The new shares apply from the next step on.
  if (step > 0 && s.balancer->update(step, replicaSeconds(figures, layout))) {
    record.rebalance = s.balancer->lastChange();
    s.options.replica_shares = s.balancer->shares();
    s.engine->setReplicaShares(s.options.replica_shares);
  }
  s.recut->afterStep(step, hooks, record);
  record.step_seconds = clock.seconds();
  record.samples_per_second = s.global_batch / record.step_seconds;
  return record;
}

std::unique_ptr<StepEngine> makePipelineStageEngine(TrainingContext& context,
                                                    const plan::Plan& plan) {
  return std::make_unique<PipelineStageEngine>(context, plan);
}

}  // namespace chorus::runtime
