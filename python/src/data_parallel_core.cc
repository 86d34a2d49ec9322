// One rank's step for the Python front (data_parallel_core.h): the reducer on the module's
// parameters, the compute phases of an emulated device, the figures all ranks all-gather and the
// balancer they feed.
#include "data_parallel_core.h"

#include <ATen/ATen.h>

#include <numeric>

#include "chorus/core/error.h"
#include "chorus/core/logging.h"
#include "chorus/plan/survivors.h"
#include "chorus/runtime/train/gradient_path.h"
#include "chorus/runtime/train/step_figures.h"
#include "step_observer.h"

namespace chorus::python {
namespace {

using TraceClock = observe::TraceRecorder::Clock;

plan::BalancerMode parseBalance(const std::string& text) {
  if (text == "adaptive") return plan::BalancerMode::kAdaptive;
  if (text == "static") return plan::BalancerMode::kStatic;
  if (text == "fixed") return plan::BalancerMode::kOff;
  CHORUS_THROW(ConfigError, "unknown balance '", text,
               "': expected adaptive (rebalance whenever it pays), static (once, after "
               "profiling) or fixed (keep the initial shares)");
}

void checkOptions(const DataParallelOptions& options, int world) {
  CHORUS_CHECK_CONFIG(options.global_batch >= world, "global_batch ", options.global_batch,
                      " must be at least the number of ranks, ", world,
                      " (every rank takes at least one sample of each global batch)");
  CHORUS_CHECK_CONFIG(options.bucket_cap_mb > 0, "bucket_cap_mb must be positive, got ",
                      options.bucket_cap_mb);
  checkZeroOptions(options.zero, world);
  CHORUS_CHECK_CONFIG(options.zero.stage < 2 || options.algorithm == AllReduceAlgorithm::kFlat,
                      "ZeRO stage ", options.zero.stage,
                      " reduce-scatters the gradients flat; algorithm ",
                      toString(options.algorithm), " takes stage 0 or 1");
  if (options.shares.empty()) return;
  CHORUS_CHECK_CONFIG(static_cast<int>(options.shares.size()) == world, "shares has ",
                      options.shares.size(), " entries for ", world, " ranks");
  std::int64_t sum = 0;
  for (std::int64_t share : options.shares) {
    CHORUS_CHECK_CONFIG(share >= 1, "every share must be at least 1, got ", share);
    sum += share;
  }
  CHORUS_CHECK_CONFIG(sum == options.global_batch, "shares sum to ", sum, ", not to global_batch ",
                      options.global_batch);
}

}  // namespace

DataParallelCore::DataParallelCore(std::shared_ptr<runtime::Worker> worker,
                                   std::vector<at::Tensor> parameters,
                                   const DataParallelOptions& options)
    : worker_(std::move(worker)), options_(options), emulator_(worker_->emulator()) {
  CHORUS_CHECK_CONFIG(worker_->world() != nullptr, "DataParallel needs a connected worker");
  checkOptions(options_, worldSize());
  CHORUS_CHECK_CONFIG(!parameters.empty(),
                      "DataParallel: the module has no parameter that "
                      "requires a gradient");
  plan::BalancerOptions balancer;
  balancer.mode = parseBalance(options_.balance);
  balancer.initial_shares = options_.shares;
  // A rank with no samples would get an empty batch from ShardSampler, which a user's loop need
  // not expect: the Python front keeps every rank in.
  balancer.leave_out = false;
  balancer_ = std::make_unique<plan::LoadBalancer>(balancer, worldSize(), options_.global_batch);

  parallel::ReducerOptions reducer = reducerOptions();
  if (options_.zero.stage >= 1)
    zero_ = std::make_unique<ZeroCore>(*worker_, parameters, options_.zero, reducer);
  parameters_ = parameters;
  reducer_ = std::make_unique<parallel::GradientReducer>(std::move(parameters), worker_->world(),
                                                         std::move(reducer));
  if (options_.observe.any())
    observer_ = std::make_unique<StepObserver>(worker_, options_.observe, options_.global_batch);
}

parallel::ReducerOptions DataParallelCore::reducerOptions() {
  parallel::ReducerOptions reducer;
  reducer.bucket_bytes = static_cast<std::int64_t>(options_.bucket_cap_mb * (1 << 20));
  reducer.first_bucket_bytes = std::min(reducer.first_bucket_bytes, reducer.bucket_bytes);
  reducer.overlap = options_.overlap;
  // Collective: as chorus train, a module on a GPU reduces on the device through NCCL where one
  // native collective spans the world, and in host memory (or bridged) beside unlike ranks.
  const std::string path = runtime::chooseGradientPath(*worker_, options_.algorithm, reducer);
  if (!path.empty() && rank() == 0) logInfo("gradient all-reduce: ", path);
  // An emulated device holds each bucket back when backward finishes it, noting how far the
  // phase's compute had got; endPhase() launches it when the slower device would have got there
  // (docs/architecture.md, "Emulated heterogeneity"). This object outlives the reducer it owns.
  reducer.hold_launch = [this](int /*bucket*/) {
    ++released_;
    if (!phase_ || !emulator_.emulated()) return false;
    held_at_.push_back(phase_->computeSoFar());
    return true;
  };
  return reducer;
}

DataParallelCore::~DataParallelCore() {
  // A phase left open by an error ends without padding (no one waits for it).
  held_at_.clear();
  phase_.reset();
}

int DataParallelCore::rank() const { return worker_->rank(); }
int DataParallelCore::worldSize() const { return worker_->worldSize(); }
std::int64_t DataParallelCore::localShare() const { return shares()[rank()]; }

void DataParallelCore::broadcastFromRankZero(std::vector<at::Tensor> tensors) {
  for (at::Tensor& tensor : tensors) {
    at::NoGradGuard no_grad;
    // Through host memory: ranks of unlike devices (a GPU beside CPU ranks) share no device
    // collective, and this runs once, before the first step.
    at::Tensor flat = tensor.detach().to(at::kCPU).contiguous();
    worker_->world()->broadcast(flat, 0).wait();
    if (!flat.is_same(tensor)) tensor.detach().copy_(flat);
  }
}

void DataParallelCore::beginForward(bool arm, std::int64_t samples) {
  CHORUS_CHECK_CONFIG(!synchronized_,
                      "a forward after the step's gradients were synchronized: "
                      "call chorus.step(optimizer) first");
  if (!step_open_) {
    step_open_ = true;
    if (observer_) observer_->beginStep(step_);
    const auto turn_start = TraceClock::now();
    emulator_.beginStep();  // an emulated device sharing a core may wait for its turn here
    if (TraceClock::now() - turn_start > std::chrono::microseconds(50))
      traceSpan(observe::Track::kCompute, "wait for turn", "pad", turn_start);
  }
  // ZeRO-3: the whole module from the slices, outside the compute phase (a wait for peers).
  if (zero_ && !zero_->gathered()) {
    endPhase();
    zero_->gather();
  }
  endPhase();
  if (arm) {
    CHORUS_CHECK_CONFIG(released_ == 0,
                        "the step's gradients were sent already: a step with several backward "
                        "passes runs all but the last under `with model.no_sync():`");
    reducer_->armForFinalBackward();
    armed_ = true;
  }
  forward_samples_ += samples;
  phase_.emplace(emulator_.compute());
  forward_start_ = TraceClock::now();
  backward_start_.reset();
}

void DataParallelCore::endForward() {
  if (!phase_ || backward_start_) return;
  traceSpan(observe::Track::kCompute, "forward", "compute", forward_start_);
  backward_start_ = TraceClock::now();
}

void DataParallelCore::traceSpan(observe::Track track, const char* name, const char* category,
                                 TraceClock::time_point start) {
  if (!observer_) return;
  if (observe::TraceRecorder* trace = observer_->trace())
    trace->span(track, name, category, start, TraceClock::now());
}

void DataParallelCore::endPhase() {
  if (!phase_) return;
  // The phase's compute ends here: from the forward's end (or its start, when it was not told) on
  // it is the backward and whatever the program did before the step went on.
  if (backward_start_)
    traceSpan(observe::Track::kCompute, "backward", "compute", *backward_start_);
  else
    traceSpan(observe::Track::kCompute, "forward", "compute", forward_start_);
  const auto pad_start = TraceClock::now();
  double padded = 0;
  for (const double compute : held_at_) {
    padded += phase_->padTo(compute);
    reducer_->launchNextHeld();
  }
  held_at_.clear();
  padded += phase_->end();
  if (padded > 0) traceSpan(observe::Track::kCompute, "pad", "pad", pad_start);
  backward_start_.reset();
  compute_seconds_ += phase_->deviceSeconds();
  phase_.reset();
}

void DataParallelCore::synchronize() {
  if (synchronized_) return;
  endPhase();
  wait_seconds_ = reducer_->finish(options_.global_batch).wait_seconds;
  synchronized_ = true;
  if (observer_ != nullptr && observer_->trace() != nullptr)
    for (const parallel::BucketTiming& timing : reducer_->lastTimings())
      observer_->trace()->span(observe::Track::kComm,
                               "all_reduce bucket " + std::to_string(timing.bucket), "allreduce",
                               timing.launched, timing.completed);
  if (zero_) {
    zero_->takeGradients();
    zero_->release();
  }
}

bool DataParallelCore::gradientsFinite() const {
  CHORUS_CHECK_CONFIG(synchronized_, "gradientsFinite() before the step's synchronize()");
  return reducer_->gradientsFinite();
}

StepFigures DataParallelCore::finishStep(double loss_sum, bool overflow, std::int64_t samples) {
  synchronize();
  if (samples < 0) samples = forward_samples_ > 0 ? forward_samples_ : localShare();
  runtime::RankFigures reported;
  reported.compute_seconds = compute_seconds_;
  reported.wait_seconds = wait_seconds_;
  reported.loss_sum = loss_sum;
  reported.overflow = overflow;
  reported.samples = samples;
  const auto figures_start = TraceClock::now();
  const runtime::StepFigures all =
      runtime::StepFigures::exchange(*worker_->world(), reported, /*always=*/true);
  traceSpan(observe::Track::kComm, "step figures", "sync", figures_start);

  StepFigures figures;
  figures.step = step_;
  figures.compute_seconds = all.computeSeconds();
  figures.wait_seconds = all.waitSeconds();
  figures.samples = all.samples();
  figures.overflow = all.anyOverflow();
  const double loss_total = all.lossSum();
  const std::int64_t samples_total = all.totalSamples();
  figures.loss = loss_total / static_cast<double>(options_.global_batch);
  // The reducer divided by B: a step whose ranks took another number of samples in all computed
  // the wrong gradient. Every rank sees the same sums, so every rank throws.
  CHORUS_CHECK_CONFIG(samples_total == options_.global_batch, "step ", step_,
                      ": the ranks processed ", samples_total, " samples in all (",
                      joinInts(std::vector<int>(figures.samples.begin(), figures.samples.end())),
                      "), but global_batch is ", options_.global_batch,
                      "; give each rank its share (chorus.ShardSampler does)");
  // Step 0 pays one-time costs (allocations, caches) that would mislead the balancer's fit.
  if (step_ > 0 && balancer_->update(step_, figures.compute_seconds, figures.samples))
    figures.rebalance = balancer_->lastChange();
  figures.next_shares = balancer_->shares();
  if (observer_) observer_->figuresExchanged(figures);

  ++step_;
  resetStep();
  return figures;
}

void DataParallelCore::endStep(double lr, double loss_scale, bool loss_known) {
  if (!observer_) return;
  StepExtras extras;
  extras.lr = lr;
  extras.loss_scale = loss_scale;
  extras.loss_known = loss_known;
  observer_->endStep(extras);
}

void DataParallelCore::noteRecovery(int generation, double agree_seconds, double rebuild_seconds,
                                    const std::vector<int>& lost) {
  if (observer_) observer_->recovery(generation, agree_seconds, rebuild_seconds, lost);
}

void DataParallelCore::flushObservation() {
  if (observer_) observer_->flush();
}

void DataParallelCore::resetStep() {
  held_at_.clear();
  phase_.reset();
  step_open_ = armed_ = synchronized_ = false;
  backward_start_.reset();
  released_ = 0;
  compute_seconds_ = wait_seconds_ = 0;
  forward_samples_ = 0;
}

void DataParallelCore::restore(const plan::BalancerState& state, std::int64_t step) {
  CHORUS_CHECK_CONFIG(!step_open_, "restore() in the middle of a step");
  balancer_->importState(state);
  step_ = step;
}

plan::BalancerState DataParallelCore::survivorBalancerState(const std::vector<int>& kept) const {
  const plan::BalancerState state = balancer_->exportState();
  return plan::survivorBalancerState(state, kept, plan::survivorShares(state.shares, kept));
}

void DataParallelCore::regroup(const plan::BalancerState& state, std::int64_t step) {
  CHORUS_CHECK_CONFIG(!zero_,
                      "elastic recovery of a ZeRO DataParallel is not built: its slices would "
                      "have to be cut anew");
  // The interrupted step's phase ends without padding: its compute is redone.
  resetStep();
  reducer_.reset();  // its hooks go before the new reducer sets its own
  reducer_ =
      std::make_unique<parallel::GradientReducer>(parameters_, worker_->world(), reducerOptions());
  plan::BalancerOptions balancer = balancer_->options();
  balancer.initial_shares = state.shares;
  balancer_ = std::make_unique<plan::LoadBalancer>(balancer, worldSize(), options_.global_batch);
  balancer_->importState(state);
  step_ = step;
}

}  // namespace chorus::python
