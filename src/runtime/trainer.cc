#include "chorus/runtime/trainer.h"

#include <ATen/ATen.h>
#include <torch/torch.h>

#include <array>
#include <limits>

#include "balancer_settings.h"
#include "chorus/comm/hierarchical_all_reduce.h"
#include "chorus/comm/topology.h"
#include "chorus/core/clock.h"
#include "chorus/core/error.h"
#include "chorus/core/logging.h"
#include "chorus/core/units.h"
#include "chorus/data/sharding.h"
#include "chorus/device/memory_budget.h"
#include "chorus/observe/trace_recorder.h"
#include "chorus/runtime/job_plan.h"
#include "chorus/runtime/memory_calibration.h"
#include "trainer_state.h"

namespace chorus::runtime {
namespace {

// Per-rank figures of a step, all-gathered so every rank sees the same numbers.
enum Figure { kCompute, kWait, kLossSum, kOverflow, kStop, kLossScale, kFigures };

struct StepFigures {
  std::vector<std::array<double, kFigures>> ranks;
  std::vector<double> column(Figure figure) const {
    std::vector<double> values;
    for (const auto& rank : ranks) values.push_back(rank[figure]);
    return values;
  }
  double sum(Figure figure) const {
    double total = 0;
    for (const auto& rank : ranks) total += rank[figure];
    return total;
  }
  bool any(Figure figure) const { return sum(figure) > 0; }
};

StepFigures gatherFigures(comm::Communicator& world, const std::array<double, kFigures>& mine) {
  at::Tensor local = at::tensor(std::vector<double>(mine.begin(), mine.end()), at::kDouble);
  at::Tensor all = at::empty({kFigures * world.size()}, at::kDouble);
  world.allGather(local, all).wait();
  StepFigures figures;
  auto values = all.accessor<double, 1>();
  figures.ranks.resize(world.size());
  for (int rank = 0; rank < world.size(); ++rank)
    for (int k = 0; k < kFigures; ++k) figures.ranks[rank][k] = values[kFigures * rank + k];
  return figures;
}

struct ShareResult {
  double compute_seconds = 0;
  double loss_sum = 0;
  bool overflow = false;  // this rank's own gradients overflowed (seen before the reduction)
};

// Makes a compute phase the one the reducer's hold_launch notes (State::phase) while it lives.
class CurrentPhase {
 public:
  CurrentPhase(Trainer::State& s, device::SpeedEmulator::ComputeScope& phase) : s_(s) {
    s_.phase = &phase;
  }
  ~CurrentPhase() { s_.phase = nullptr; }
  CurrentPhase(const CurrentPhase&) = delete;
  CurrentPhase& operator=(const CurrentPhase&) = delete;

 private:
  Trainer::State& s_;
};

using TraceClock = observe::TraceRecorder::Clock;

// Records a span on this step's timeline, if it is recorded.
void traceSpan(Trainer::State& s, observe::Track track, const char* name, const char* category,
               TraceClock::time_point start) {
  if (s.trace != nullptr) s.trace->span(track, name, category, start, TraceClock::now());
}

// Each bucket's all-reduce of the step, from its launch to when the reducer saw it complete.
void traceBuckets(observe::TraceRecorder& trace,
                  const std::vector<parallel::BucketTiming>& timings) {
  for (const parallel::BucketTiming& timing : timings)
    trace.span(observe::Track::kComm, "all_reduce bucket " + std::to_string(timing.bucket),
               "allreduce", timing.launched, timing.completed);
}

// Launches the buckets the reducer held back in `phase`, each when the emulated device would have
// had its gradients ready.
void releaseHeldBuckets(Trainer::State& s, device::SpeedEmulator::ComputeScope& phase) {
  for (const double compute : s.held_at) {
    const auto start = TraceClock::now();
    if (phase.padTo(compute) > 0) traceSpan(s, observe::Track::kCompute, "pad", "pad", start);
    s.reducer->launchNextHeld();
  }
  s.held_at.clear();
}

// This rank's share of the step: forward in the rank's precision, backward of the (scaled) loss
// over micro-batches that fit its memory. The reducer's hooks fire during the last backward.
// An emulated slower device computes each micro-batch in one block and pads it at its end, but
// releases its gradient buckets at the emulated pace (DESIGN.md, "Emulated heterogeneity"): the
// reducer holds each one back (reducerOptions), and the padding launches it at the moment the
// slower device would have had it ready, so its all-reduces cannot hide in one final sleep.
ShareResult runShare(Trainer::State& s, const std::vector<std::int64_t>& mine, bool inject,
                     bool arm_reducer) {
  const auto micro = data::microBatches(
      mine, s.micro_limit > 0 ? s.micro_limit : std::max<std::int64_t>(1, mine.size()));
  s.optimizer->zero_grad(/*set_to_none=*/true);
  s.model->train();
  if (s.unscaler) s.unscaler->beginStep(s.scaler->scale());
  s.held_at.clear();  // what a failed step left
  const auto turn_start = TraceClock::now();
  s.emulator->beginStep();  // an emulated device sharing a core may wait for its turn here
  if (TraceClock::now() - turn_start > std::chrono::microseconds(50))
    traceSpan(s, observe::Track::kCompute, "wait for turn", "pad", turn_start);
  ShareResult result;
  for (size_t k = 0; k < micro.size(); ++k) {
    const data::Batch batch = s.data.train->get(micro[k]);
    if (arm_reducer && k + 1 == micro.size()) s.reducer->armForFinalBackward();
    const auto forward_start = TraceClock::now();
    auto phase = s.emulator->compute();
    const CurrentPhase current(s, phase);
    at::Tensor loss;
    {
      parallel::AutocastScope autocast(s.worker->device().type(), s.precision);
      loss = s.model->lossSum(s.model->forward(batch.inputs.to(s.worker->device())),
                              batch.targets.to(s.worker->device()));
    }
    traceSpan(s, observe::Track::kCompute, "forward", "compute", forward_start);
    const auto backward_start = TraceClock::now();
    at::Tensor scaled = s.scaler ? loss * s.scaler->scale() : loss;
    if (inject && k + 1 == micro.size()) scaled = scaled * std::numeric_limits<float>::infinity();
    scaled.backward();
    result.loss_sum += loss.item<double>();  // also waits for a GPU's queued work
    traceSpan(s, observe::Track::kCompute, "backward", "compute", backward_start);
    releaseHeldBuckets(s, phase);
    const auto pad_start = TraceClock::now();
    if (phase.end() > 0) traceSpan(s, observe::Track::kCompute, "pad", "pad", pad_start);
    result.compute_seconds += phase.deviceSeconds();
  }
  result.overflow = s.unscaler && s.unscaler->overflowed();
  return result;
}

// Buckets, and the topology-aware path when the job asks for it: a hierarchical all-reduce over
// the hosts and/or a codec where gradients cross them.
parallel::ReducerOptions reducerOptions(Trainer::State& s) {
  const CommSection& section = s.job.comm;
  parallel::ReducerOptions options;
  // At least one byte: a positive bucket_mb below a byte still means "as small as it gets".
  const auto bytesOf = [](double mib) {
    return std::max<std::int64_t>(1, static_cast<std::int64_t>(mib * (1 << 20)));
  };
  options.bucket_bytes = bytesOf(section.bucket_mb);
  options.first_bucket_bytes = bytesOf(section.first_bucket_mb);
  options.min_buckets = static_cast<int>(section.min_buckets);
  options.overlap = section.overlap;
  // Holds a bucket back when it is ready inside an emulated compute phase, noting how far the
  // phase had got (runShare launches it at the emulated moment); launches after the phase
  // (finish(), overlap off) find none and go out at once. The State outlives the reducer it owns.
  options.hold_launch = [&s](int /*bucket*/) {
    if (s.phase == nullptr || !s.emulator->emulated()) return false;
    s.held_at.push_back(s.phase->computeSoFar());
    return true;
  };
  if (section.algorithm != "flat") {
    comm::RankDescriptor self;
    self.host_id = s.worker->identity().host_id;
    self.vendor = s.worker->identity().device.kind == DeviceKind::kCuda ? "nvidia" : "cpu";
    comm::HierarchicalOptions hierarchical;
    hierarchical.algorithm = comm::parseAllReduceAlgorithm(section.algorithm);
    auto topology = comm::Topology::discover(*s.worker->world(), self, comm::GroupBy::kHost);
    if (s.worker->rank() == 0)
      logInfo("gradient all-reduce: ", section.algorithm, " over ", topology.describe());
    options.hierarchical = std::make_shared<comm::HierarchicalAllReduce>(
        s.worker->world(), std::move(topology), hierarchical);
  }
  if (section.compression != "none") {
    parallel::CodecOptions codec;
    codec.kind = parallel::parseCodecKind(section.compression);
    codec.powersgd_rank = static_cast<int>(section.powersgd_rank);
    codec.powersgd_iterations = static_cast<int>(section.powersgd_iterations);
    codec.powersgd_bf16_factors = section.powersgd_bf16_factors;
    codec.powersgd_min_compression_rate = section.powersgd_min_compression_rate;
    codec.powersgd_start_step = static_cast<int>(section.powersgd_start_step);
    codec.topk_ratio = section.topk_ratio;
    codec.error_feedback = section.error_feedback;
    codec.seed = s.job.seed;
    s.codec = parallel::makeCodec(codec);
    options.codec = s.codec;
  }
  return options;
}

// The rank's compute format (the plan's), and a loss scaler when it is fp16.
void setUpPrecision(Trainer::State& s, const plan::RankPlan& rank) {
  s.precision = parallel::parsePrecision(precisionName(rank));
  parallel::allowTf32(s.job.precision.tf32);
  if (!parallel::needsLossScaling(s.precision)) return;
  const bool cuda = s.worker->identity().device.kind == DeviceKind::kCuda;
  const auto& section = cuda ? s.job.precision.loss_scale_cuda : s.job.precision.loss_scale_cpu;
  parallel::LossScalerOptions options;
  options.init_scale = section.init;
  options.growth_factor = section.growth;
  options.backoff_factor = section.backoff;
  options.growth_interval = section.interval;
  s.scaler.emplace(options);
  s.unscaler = std::make_unique<parallel::GradientUnscaler>(s.model->parameters());
}

// Each rank's start share under `plan`, by rank. Throws ConfigError unless the plan is a
// data-parallel plan for this world and this rank's device.
std::vector<std::int64_t> planShares(const plan::Plan& plan, const Worker& worker) {
  const int ranks = worker.worldSize();
  CHORUS_CHECK_CONFIG(plan.stageCount() == 1, "trainer: a plan of ", plan.stageCount(),
                      " stages is run by the pipeline trainer");
  CHORUS_CHECK_CONFIG(static_cast<int>(plan.ranks.size()) == ranks, "trainer: a plan of ",
                      plan.ranks.size(), " ranks in a job of ", ranks);
  const plan::RankPlan& mine = plan.ranks.at(worker.rank());
  CHORUS_CHECK_CONFIG(mine.device_type == worker.identity().device.toString(), "trainer: rank ",
                      worker.rank(), " was planned for '", mine.device_type, "' but runs on '",
                      worker.identity().device.toString(), "'");
  std::vector<std::int64_t> shares(ranks, 0);
  for (const plan::ReplicaPlan& replica : plan.replicas)
    shares.at(replica.stages.at(0).rank) = replica.share;
  return shares;
}

// The plan's micro-batch for this rank when it asks for accumulation, else the job's limit.
std::int64_t planMicroBatch(const plan::Plan& plan, const JobConfig& job, int rank) {
  for (const plan::ReplicaPlan& replica : plan.replicas)
    if (replica.stages.at(0).rank == rank && replica.stages[0].micro_batch < replica.share)
      return replica.stages[0].micro_batch;
  return job.train.micro_batch;
}

}  // namespace

Trainer::Trainer(JobConfig job, std::shared_ptr<Worker> worker)
    : Trainer(job, planOfWorld(job, *worker), worker) {}

Trainer::Trainer(JobConfig job, plan::Plan plan, std::shared_ptr<Worker> worker)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.job = std::move(job);
  s.worker = std::move(worker);
  comm::Communicator& world = *s.worker->world();
  const std::vector<std::int64_t> start_shares = planShares(plan, *s.worker);
  TrainingStart start = startTraining(s.job, *s.worker);
  s.data = std::move(start.data);
  s.sampler = std::move(start.sampler);
  s.model = std::move(start.model);
  s.optimizer = makeOptimizer(s.job.optimizer, s.model->parameters());
  parallel::ReducerOptions reducing = reducerOptions(s);
  s.reducer = std::make_unique<parallel::GradientReducer>(s.model->parameters(), s.worker->world(),
                                                          reducing);
  setUpPrecision(s, plan.ranks.at(world.rank()));
  if (world.rank() == 0)
    logInfo("world: ", world.size(), " ranks, CPU collectives over ", world.cpuTransport(),
            ", rank 0 computes in ", parallel::toString(s.precision));
  if (!s.job.checkpoint.dir.empty()) {
    CheckpointOptions options;
    options.root = s.job.checkpoint.dir;
    options.keep = static_cast<int>(s.job.checkpoint.keep);
    s.checkpoints =
        std::make_unique<CheckpointWriter>(options, s.worker->store(), world.rank(), world.size());
  }
  // balancer.shares fixes the shares: the balancer does not run.
  if (!s.job.balancer.shares.empty()) s.fixed_shares = start_shares;
  plan::BalancerOptions balancing = balancerOptions(s.job.balancer);
  balancing.initial_shares = start_shares;
  s.balancer =
      std::make_unique<plan::LoadBalancer>(balancing, world.size(), s.job.train.global_batch,
                                           std::vector<std::int64_t>(world.size(), 0));
  s.speed = s.worker->identity().device.speed;
  s.emulator = &s.worker->emulator();
  const auto& budget = s.worker->identity().device.memory_budget;
  // The job's memory model, calibrated by measuring the model's layers (memory_calibration.h).
  s.micro_limit = budget
                      ? maxMicroBatch(jobMemoryModel(s.job), plan.ranks.at(world.rank()).precision,
                                      *budget, s.worker->identity().device.toString())
                      : 0;
  const std::int64_t planned_micro = planMicroBatch(plan, s.job, world.rank());
  if (planned_micro > 0)
    s.micro_limit = s.micro_limit > 0 ? std::min(s.micro_limit, planned_micro) : planned_micro;
  // Data and model are in place: from here on the budget counts what training allocates.
  if (budget) {
    s.worker->enforceMemoryBudget();
    logInfo("memory budget ", formatBytes(*budget), ": micro-batches of at most ", s.micro_limit,
            " samples");
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

std::int64_t Trainer::nextStep() const { return state_->next_step; }

device::EmulationTotals Trainer::emulationTotals() const { return state_->emulator->totals(); }

std::string Trainer::precision() const { return parallel::toString(state_->precision); }

double Trainer::lossScale() const { return state_->scaler ? state_->scaler->scale() : 0.0; }

model::ZooModel& Trainer::model() { return *state_->model; }

const std::vector<std::int64_t>& Trainer::shares() const {
  return state_->fixed_shares.empty() ? state_->balancer->shares() : state_->fixed_shares;
}

StepRecord Trainer::step(const TrainerHooks& hooks) {
  State& s = *state_;
  comm::Communicator& world = *s.worker->world();
  const std::int64_t step = s.next_step++;
  if (hooks.speed_at) {
    const double speed = hooks.speed_at(step);
    if (speed != s.speed) {
      s.speed_override = s.worker->makeEmulator(s.speed = speed);
      s.emulator = s.speed_override.get();
      s.emulator->yieldCoreToFasterDevices();
    }
  }
  if (hooks.trace != nullptr) hooks.trace->setStep(step);
  s.trace = hooks.trace != nullptr && hooks.trace->recording() ? hooks.trace : nullptr;
  Stopwatch clock;
  StepRecord record;
  record.step = step;
  record.shares = shares();
  record.lr = learningRateAt(s.job.optimizer, step, s.job.train.steps);
  setLearningRate(*s.optimizer, record.lr);

  const auto mine = data::shardOf(s.sampler->batch(step), record.shares, world.rank());
  const bool inject = hooks.inject_overflow && hooks.inject_overflow(step);
  // Local SGD: no gradient all-reduce; each rank steps on its own mean gradient and parameters
  // are averaged every sync_every steps.
  const bool local = s.job.comm.sync_every > 1;
  const ShareResult share = runShare(s, mine, inject, /*arm_reducer=*/!local);
  parallel::ReduceTiming reduce;
  if (local)
    s.reducer->finishLocal(static_cast<std::int64_t>(mine.size()));
  else
    reduce = s.reducer->finish(s.job.train.global_batch);
  if (s.trace != nullptr && !local) traceBuckets(*s.trace, s.reducer->lastTimings());
  // A non-finite reduced gradient is the same on every rank, so this needs no agreement; the
  // gathered flags add overflows that a lossy path could have hidden.
  const bool local_overflow = share.overflow || !s.reducer->gradientsFinite();
  const bool stop = hooks.stop_requested && hooks.stop_requested();
  const auto figures_start = TraceClock::now();
  const StepFigures figures = gatherFigures(
      world, {share.compute_seconds, reduce.wait_seconds, share.loss_sum,
              local_overflow ? 1.0 : 0.0, stop ? 1.0 : 0.0, s.scaler ? s.scaler->scale() : 0.0});
  traceSpan(s, observe::Track::kComm, "step figures", "sync", figures_start);
  record.skipped = figures.any(kOverflow);
  record.stop_requested = figures.any(kStop);
  const auto optimizer_start = TraceClock::now();
  if (record.skipped) {
    ++s.skipped_steps;  // every rank skips together: the replicas stay identical
    s.optimizer->zero_grad(/*set_to_none=*/true);
  } else {
    s.optimizer->step();
  }
  traceSpan(s, observe::Track::kCompute, "optimizer", "optimizer", optimizer_start);
  if (s.scaler) s.scaler->update(record.skipped);
  if (local) {
    s.samples_since_average += static_cast<std::int64_t>(mine.size());
    if ((step + 1) % s.job.comm.sync_every == 0) {
      s.reducer->averageParameters(static_cast<double>(s.samples_since_average));
      s.samples_since_average = 0;
    }
  }
  record.loss = figures.sum(kLossSum) / static_cast<double>(s.job.train.global_batch);
  record.compute_seconds = figures.column(kCompute);
  record.wait_seconds = figures.column(kWait);
  record.loss_scales = figures.column(kLossScale);
  // Step 0 pays one-time costs (allocations, caches) that would mislead the balancer's fit.
  if (s.fixed_shares.empty() && step > 0 && s.balancer->update(step, record.compute_seconds))
    record.rebalance = s.balancer->lastChange();
  record.step_seconds = clock.seconds();
  record.samples_per_second = s.job.train.global_batch / record.step_seconds;
  if (hooks.on_step) hooks.on_step(record);
  return record;
}

}  // namespace chorus::runtime
