// The data-parallel step: this rank's share of the global batch in micro-batches, the gradient
// all-reduce, the overflow consensus of mixed precision, the optimizer, the balancer's next shares.
#include "train/data_parallel_engine.h"

#include <ATen/ATen.h>
#include <torch/torch.h>

#include <array>
#include <limits>

#include "chorus/core/clock.h"
#include "chorus/data/sharding.h"
#include "chorus/observe/trace_recorder.h"
#include "chorus/runtime/train/step_figures.h"

namespace chorus::runtime {

struct DataParallelEngine::ShareResult {
  double compute_seconds = 0;
  double loss_sum = 0;
  bool overflow = false;  // this rank's own gradients overflowed (seen before the reduction)
};

namespace {

// Makes a compute phase the one the reducer's hold_launch notes (`current`, the engine's phase)
// while it lives.
class CurrentPhase {
 public:
  CurrentPhase(device::SpeedEmulator::ComputeScope*& current,
               device::SpeedEmulator::ComputeScope& phase)
      : current_(current) {
    current_ = &phase;
  }
  ~CurrentPhase() { current_ = nullptr; }
  CurrentPhase(const CurrentPhase&) = delete;
  CurrentPhase& operator=(const CurrentPhase&) = delete;

 private:
  device::SpeedEmulator::ComputeScope*& current_;
};

using TraceClock = observe::TraceRecorder::Clock;

// Records a span on this step's timeline `trace`, if it is recorded (not null).
void traceSpan(observe::TraceRecorder* trace, observe::Track track, const char* name,
               const char* category, TraceClock::time_point start) {
  if (trace != nullptr) trace->span(track, name, category, start, TraceClock::now());
}

// Each bucket's all-reduce of the step, from its launch to when the reducer saw it complete.
void traceBuckets(observe::TraceRecorder& trace,
                  const std::vector<parallel::BucketTiming>& timings) {
  for (const parallel::BucketTiming& timing : timings)
    trace.span(observe::Track::kComm, "all_reduce bucket " + std::to_string(timing.bucket),
               "allreduce", timing.launched, timing.completed);
}

}  // namespace

// Launches the buckets the reducer held back in `phase`, each when the emulated device would have
// had its gradients ready.
void DataParallelEngine::releaseHeldBuckets(device::SpeedEmulator::ComputeScope& phase) {
  for (const double compute : held_at_) {
    const auto start = TraceClock::now();
    if (phase.padTo(compute) > 0) traceSpan(trace_, observe::Track::kCompute, "pad", "pad", start);
    reducer_->launchNextHeld();
  }
  held_at_.clear();
}

// The micro-batches of this rank's share `mine` when the ranks' shares are `shares`: at most
// micro_limit_ samples each. Under ZeRO-3 every rank runs as many (each forward and backward
// gathers every layer from all ranks), the most that any rank's share needs; a rank that needs
// fewer runs empty ones after its own, which add exact zeros to its gradients.
std::vector<std::vector<std::int64_t>> DataParallelEngine::microBatchesOf(
    const std::vector<std::int64_t>& mine, const std::vector<std::int64_t>& shares) const {
  const auto limitOf = [](std::int64_t limit, std::int64_t share) {
    return limit > 0 ? limit : std::max<std::int64_t>(1, share);
  };
  auto micro = data::microBatches(mine, limitOf(micro_limit_, mine.size()));
  if (!zero_layers_) return micro;
  std::int64_t passes = 1;
  for (size_t r = 0; r < shares.size(); ++r) {
    const std::int64_t limit = limitOf(micro_limits_.at(r), shares[r]);
    passes = std::max(passes, (shares[r] + limit - 1) / limit);
  }
  micro.resize(passes);
  return micro;
}

// This rank's share of the step: forward in the rank's precision, backward of the (scaled) loss
// over micro-batches that fit its memory. The reducer's hooks fire during the last backward.
// An emulated slower device computes each micro-batch in one block and pads it at its end, but
// releases its gradient buckets at the emulated pace (docs/architecture.md, "Emulated
// heterogeneity"): the reducer holds each one back (reducerOptions), and the padding launches it
// at the moment the slower device would have had it ready, so its all-reduces cannot hide in one
// final sleep.
DataParallelEngine::ShareResult DataParallelEngine::runShare(
    const std::vector<std::int64_t>& mine, const std::vector<std::int64_t>& shares, bool inject,
    bool arm_reducer) {
  const auto micro = microBatchesOf(mine, shares);
  clearGradients();
  model_->train();
  if (unscaler_) unscaler_->beginStep(scaler_->scale());
  held_at_.clear();  // what a failed step left
  const auto turn_start = TraceClock::now();
  emulator_->beginStep();  // an emulated device sharing a core may wait for its turn here
  if (TraceClock::now() - turn_start > std::chrono::microseconds(50))
    traceSpan(trace_, observe::Track::kCompute, "wait for turn", "pad", turn_start);
  ShareResult result;
  at::Tensor loss_sum;  // on the device: read once a phase must be timed (below)
  for (size_t k = 0; k < micro.size(); ++k) {
    const data::Batch batch = data_.train->get(micro[k]);
    if (arm_reducer && k + 1 == micro.size()) reducer_->armForFinalBackward();
    const auto forward_start = TraceClock::now();
    auto phase = emulator_->compute();
    const CurrentPhase current(phase_, phase);
    at::Tensor loss;
    {
      parallel::AutocastScope autocast(worker_->device().type(), compute_precision_);
      loss = model_->lossSum(forward(batch.inputs.to(worker_->device())),
                             batch.targets.to(worker_->device()));
    }
    traceSpan(trace_, observe::Track::kCompute, "forward", "compute", forward_start);
    const auto backward_start = TraceClock::now();
    at::Tensor scaled = scaler_ ? loss * scaler_->scale() : loss;
    if (inject && k + 1 == micro.size()) scaled = scaled * std::numeric_limits<float>::infinity();
    scaled.backward();
    if (zero_layers_) zero_layers_->release();
    loss_sum = loss_sum.defined() ? loss_sum + loss.detach() : loss.detach();
    // Reading the sum waits for a GPU's queued work, which a phase's time must include: after
    // each micro-batch when the phase is padded to an emulated speed, else once, after the last
    // (the phases before it then measure their launches, the last the queue's whole rest).
    if (emulator_->emulated() || k + 1 == micro.size()) result.loss_sum = loss_sum.item<double>();
    traceSpan(trace_, observe::Track::kCompute, "backward", "compute", backward_start);
    releaseHeldBuckets(phase);
    const auto pad_start = TraceClock::now();
    if (phase.end() > 0) traceSpan(trace_, observe::Track::kCompute, "pad", "pad", pad_start);
    result.compute_seconds += phase.deviceSeconds();
  }
  result.overflow = unscaler_ && unscaler_->overflowed();
  return result;
}

// The slice's step (and its replica's), then the all-gather of every rank's slice. With replicas
// a lost peer that fails the all-gather does not undo the step: the slices already stepped, so
// this rank has completed it (and logs it) and the recovery rebuilds the parameters from the
// slices; until then the parameters are stale, and any use of them fails as the world did.
void DataParallelEngine::stepZero() {
  zero_->stepSlices();
  if (!zero_->redundant()) {
    zero_->gatherParameters();
    return;
  }
  try {
    zero_->gatherParameters();
  } catch (const CommError& error) {
    stale_parameters_ = error.what();
  }
}

void DataParallelEngine::requireGatheredParameters() const {
  if (!stale_parameters_.empty())
    CHORUS_THROW(CommError,
                 "ZeRO: the parameters of the last step were not gathered: ", stale_parameters_);
}

StepRecord DataParallelEngine::step(std::int64_t step, const TrainerHooks& hooks) {
  comm::Communicator& world = *worker_->world();
  CHORUS_CHECK_CONFIG(
      !hooks.cut_at, "TrainerHooks::cut_at moves a pipeline's cut; one stage per replica has none");
  if (hooks.speed_at) {
    const double speed = hooks.speed_at(step);
    if (speed != speed_) {
      speed_override_ = worker_->makeEmulator(speed_ = speed);
      emulator_ = speed_override_.get();
      emulator_->yieldCoreToFasterDevices();
    }
  }
  if (hooks.trace != nullptr) hooks.trace->setStep(step);
  trace_ = hooks.trace != nullptr && hooks.trace->recording() ? hooks.trace : nullptr;
  requireGatheredParameters();
  Stopwatch clock;
  StepRecord record;
  record.step = step;
  record.shares = shares();
  record.lr = learningRateAt(job_.optimizer, step, job_.train.steps);
  setLearningRate(activeOptimizer(), record.lr);
  if (zero_ && zero_->redundant()) setLearningRate(zero_->replicaOptimizer(), record.lr);

  const auto mine = data::shardOf(sampler_->batch(step), record.shares, world.rank());
  const bool inject = hooks.inject_overflow && hooks.inject_overflow(step);
  // Local SGD: no gradient all-reduce; each rank steps on its own mean gradient and parameters
  // are averaged every sync_every steps.
  const bool local = comm_.sync_period > 1;
  if (hooks.at_point) hooks.at_point(step, "forward");
  const ShareResult share = runShare(mine, record.shares, inject, /*arm_reducer=*/!local);
  if (hooks.at_point) hooks.at_point(step, "reduce");
  parallel::ReduceTiming reduce;
  if (local)
    reducer_->finishLocal(static_cast<std::int64_t>(mine.size()));
  else
    reduce = reducer_->finish(global_batch_);
  if (trace_ != nullptr && !local) traceBuckets(*trace_, reducer_->lastTimings());
  // ZeRO-1: this rank keeps its slice of the averaged gradient, and no whole one.
  if (zero_ && zero_->stage() == 1) {
    zero_->takeGradientSlice();
    clearGradients();
  }
  // A replica's gradient arrives before the step figures: a rank past them holds every gradient
  // it steps, and so does each of its peers.
  if (zero_ && zero_->stage() >= 2) zero_->exchangeReplicaGradients();
  // A non-finite reduced gradient is the same on every rank, so this needs no agreement; the
  // gathered flags add overflows that a lossy path could have hidden.
  const bool local_overflow = share.overflow || !reducer_->gradientsFinite();
  const bool stop = hooks.stop_requested && hooks.stop_requested();
  const auto figures_start = TraceClock::now();
  const double balance = hooks.balancer_seconds
                             ? hooks.balancer_seconds(step, static_cast<std::int64_t>(mine.size()))
                             : share.compute_seconds;
  RankFigures reported;
  reported.compute_seconds = share.compute_seconds;
  reported.wait_seconds = reduce.wait_seconds;
  reported.loss_sum = share.loss_sum;
  reported.overflow = local_overflow;
  reported.stop = stop;
  reported.loss_scale = scaler_ ? scaler_->scale() : 0.0;
  reported.balance = balance;
  reported.samples = static_cast<std::int64_t>(mine.size());
  // A world of one has nothing to agree on, unless it is elastic: a lone survivor learns of a
  // joining worker when an abort fails this collective.
  const StepFigures figures =
      StepFigures::exchange(world, reported, /*always=*/job_.elastic.enabled);
  traceSpan(trace_, observe::Track::kComm, "step figures", "sync", figures_start);
  record.skipped = figures.anyOverflow();
  record.stop_requested = figures.anyStop();
  if (hooks.at_point) hooks.at_point(step, "optimizer");
  const auto optimizer_start = TraceClock::now();
  if (record.skipped) {
    ++skipped_steps_;  // every rank skips together: the replicas stay identical
    clearGradients();
  } else if (zero_) {
    stepZero();
  } else {
    optimizer_->step();
  }
  traceSpan(trace_, observe::Track::kCompute, "optimizer", "optimizer", optimizer_start);
  if (scaler_) scaler_->update(record.skipped);
  if (local) {
    samples_since_average_ += static_cast<std::int64_t>(mine.size());
    if ((step + 1) % comm_.sync_period == 0) {
      reducer_->averageParameters(static_cast<double>(samples_since_average_));
      samples_since_average_ = 0;
    }
  }
  record.loss = figures.lossSum() / static_cast<double>(global_batch_);
  record.compute_seconds = figures.computeSeconds();
  record.wait_seconds = figures.waitSeconds();
  record.loss_scales = figures.lossScales();
  // Step 0 pays one-time costs (allocations, caches) that would mislead the balancer's fit.
  if (fixed_shares_.empty() && step > 0 && balancer_->update(step, figures.balance()))
    record.rebalance = balancer_->lastChange();
  record.step_seconds = clock.seconds();
  record.samples_per_second = global_batch_ / record.step_seconds;
  return record;
}

std::vector<at::Tensor> DataParallelEngine::parameterValues() {
  requireGatheredParameters();
  if (!zero_layers_) return StepEngine::parameterValues();
  const at::Tensor whole = zero_->gatherWhole();
  std::vector<at::Tensor> values(model_parameters_.size());
  std::int64_t position = 0;
  for (int index : zero_->order()) {
    const at::Tensor& parameter = model_parameters_[index];
    values[index] = whole.narrow(0, position, parameter.numel()).view(parameter.sizes()).clone();
    position += parameter.numel();
  }
  return values;
}

}  // namespace chorus::runtime
