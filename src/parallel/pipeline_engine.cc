#include <ATen/ATen.h>
#include <torch/utils.h>

#include <algorithm>
#include <optional>

#include "chorus/comm/hierarchical_all_reduce.h"
#include "chorus/comm/topology.h"
#include "chorus/core/clock.h"
#include "chorus/core/error.h"
#include "chorus/parallel/pipeline.h"
#include "pipeline_stage.h"
#include "pipeline_transport.h"

namespace chorus::parallel {
namespace {

void checkCuts(const std::vector<int>& cuts, int stages, std::int64_t layers) {
  bool valid =
      static_cast<int>(cuts.size()) == stages + 1 && cuts.front() == 0 && cuts.back() == layers;
  for (std::size_t s = 0; valid && s + 1 < cuts.size(); ++s) valid = cuts[s] < cuts[s + 1];
  if (!valid) {
    std::vector<int> shown(cuts.begin(), cuts.end());
    CHORUS_THROW(ConfigError, "pipeline cuts [", joinInts(shown), "] do not split ", layers,
                 " layers into ", stages, " non-empty stages");
  }
}

// The trainable parameters of layers [first, last).
std::vector<at::Tensor> stageParameters(model::ZooModel& model, int first, int last) {
  std::vector<at::Tensor> parameters;
  for (int l = first; l < last; ++l)
    for (const at::Tensor& parameter : model.layerParameters(l))
      if (parameter.requires_grad()) parameters.push_back(parameter);
  return parameters;
}

// The index in `program` of its last backward.
std::size_t finalBackward(const StageProgram& program) {
  std::size_t index = 0;
  for (std::size_t i = 0; i < program.size(); ++i)
    if (program[i].kind == ActionKind::kBackward) index = i;
  return index;
}

// The format activations leave a stage in.
at::ScalarType wireType(const PipelineOptions& options) {
  return options.fp32_transfers ? at::kFloat : scalarTypeOf(options.precision);
}

// The rows of micro-batch m of a replica's share (undefined in, undefined out).
at::Tensor rowsOf(const at::Tensor& share, std::int64_t offset, std::int64_t size) {
  return share.defined() ? share.narrow(0, offset, size) : at::Tensor();
}

}  // namespace

PipelineEngine::PipelineEngine(std::shared_ptr<model::ZooModel> model,
                               const PipelineOptions& options, std::vector<int> cuts,
                               PipelineResources resources)
    : model_(std::move(model)),
      options_(options),
      cuts_(std::move(cuts)),
      resources_(std::move(resources)),
      layout_(options.replicas, options.pipeline_stages) {
  CHORUS_CHECK_CONFIG(model_ != nullptr, "a pipeline engine needs a model");
  CHORUS_CHECK_CONFIG(resources_.world != nullptr, "a pipeline engine needs a communicator");
  validatePipelineOptions(options_, model_->numLayers());
  checkCuts(cuts_, layout_.stages(), model_->numLayers());
  CHORUS_CHECK_CONFIG(resources_.world->size() == layout_.worldSize(), "pipeline of ",
                      layout_.replicas(), " x ", layout_.stages(), " needs ", layout_.worldSize(),
                      " ranks, the communicator has ", resources_.world->size());
  position_ = layout_.positionOf(resources_.world->rank());
  const int s = position_.stage, r = position_.replica;
  program_ = buildSchedule(options_.schedule, layout_.stages(), options_.micro_batches)[s];
  parameters_ = stageParameters(*model_, firstLayer(), lastLayer());
  final_backward_ = finalBackward(program_);
  if (layout_.replicas() > 1) {
    stage_group_ = resources_.stage_group
                       ? resources_.stage_group
                       : resources_.world->subgroup(layout_.stageGroup(s),
                                                    "pipeline-stage" + std::to_string(s));
    ReducerOptions sync = resources_.replica_sync;
    CHORUS_CHECK_CONFIG(!sync.hold_launch,
                        "pipeline replica sync: the engine paces the buckets; leave "
                        "`hold_launch` unset");
    CHORUS_CHECK_CONFIG(sync.hierarchical == nullptr || (sync.codec && resources_.stage_group),
                        "pipeline replica sync: `hierarchical` is only a rebuilt engine's "
                        "replicaSyncEngine(), with its stage group");
    // The codec runs among the stage group's ranks on an engine of one-rank groups (collective
    // to create; a rebuild passes the previous one, whose groups' names are taken).
    if (sync.codec && !sync.hierarchical) {
      comm::HierarchicalOptions engine;
      engine.name = "replica-sync";
      sync.hierarchical = std::make_shared<comm::HierarchicalAllReduce>(
          stage_group_, comm::Topology::singletons(stage_group_->size()), engine);
    }
    sync_engine_ = sync.hierarchical;
    CHORUS_CHECK_CONFIG(sync.scatter_bounds.empty(),
                        "pipeline replica sync: ZeRO does not shard pipeline stages");
    // Holds a bucket back when it is ready inside an emulated compute phase (releaseHeldBuckets
    // launches it at the emulated moment); one ready outside a phase goes out at once.
    sync.hold_launch = [this](int /*bucket*/) {
      if (in_schedule_) ++buckets_in_schedule_;
      if (phase_ == nullptr || resources_.emulator == nullptr || !resources_.emulator->emulated())
        return false;
      held_at_.push_back(phase_->computeSoFar());
      return true;
    };
    reducer_ = std::make_unique<GradientReducer>(parameters_, stage_group_, std::move(sync));
  }
  const int previous = s > 0 ? layout_.rankOf(r, s - 1) : -1;
  const int next = s + 1 < layout_.stages() ? layout_.rankOf(r, s + 1) : -1;
  const at::Device device = parameters_.empty() ? at::Device(at::kCPU) : parameters_[0].device();
  link_ = std::make_unique<detail::StageLink>(resources_.world, previous, next, options_.timeout,
                                              device);
  runner_ = std::make_unique<detail::StageRunner>(model_, firstLayer(), lastLayer(), s == 0,
                                                  s + 1 == layout_.stages(), checkpointing(),
                                                  options_.precision, wireType(options_));
}

PipelineEngine::~PipelineEngine() = default;

Checkpointing PipelineEngine::checkpointing() const {
  return maxInFlight(program_) <= 1 ? Checkpointing::kNone : options_.activation_checkpointing;
}

void PipelineEngine::setReplicaShares(std::vector<std::int64_t> shares) {
  PipelineOptions next = options_;
  next.replica_shares = std::move(shares);
  validatePipelineOptions(next, model_->numLayers());
  options_ = std::move(next);
}

PipelineStepStats PipelineEngine::step(const at::Tensor& inputs, const at::Tensor& targets,
                                       const StepScaling& scaling) {
  Stopwatch step_clock;
  std::optional<device::MemoryAccount::Scope> memory_scope;
  if (resources_.memory) {
    resources_.memory->resetPeak();
    memory_scope.emplace(resources_.memory);
  }
  const std::int64_t share = replicaShares(options_)[position_.replica];
  const bool first = position_.stage == 0, last = position_.stage + 1 == layout_.stages();
  CHORUS_CHECK_CONFIG(!first || (inputs.defined() && inputs.size(0) == share),
                      "the first pipeline stage needs its replica's ", share, " input rows");
  CHORUS_CHECK_CONFIG(!last || (targets.defined() && targets.size(0) == share),
                      "the last pipeline stage needs its replica's ", share, " target rows");
  for (at::Tensor& parameter : parameters_)
    if (parameter.grad().defined()) parameter.mutable_grad().zero_();

  PipelineStepStats stats;
  const std::vector<std::int64_t> sizes = microBatchSizes(share, options_.micro_batches);
  link_->beginStep(sizes);
  runner_->beginStep(scaling.loss_scale,
                     scaling.inject_overflow ? program_[final_backward_].micro_batch : -1);
  held_at_.clear();  // what a failed step left
  Stopwatch schedule_clock;
  buckets_in_schedule_ = 0;
  in_schedule_ = true;
  runProgram(inputs, targets, sizes, stats);
  in_schedule_ = false;
  link_->finishStep();
  stats.schedule_seconds = schedule_clock.seconds();
  synchronizeGradients(stats);

  stats.loss_sum = runner_->lossSum();
  stats.transfer_wait_seconds = link_->waitSeconds();
  stats.idle_fraction =
      stats.schedule_seconds > 0 ? 1.0 - stats.compute_seconds / stats.schedule_seconds : 0.0;
  stats.peak_held_bytes = runner_->peakHeldBytes();
  stats.max_in_flight = maxInFlight(program_);
  if (resources_.memory) stats.peak_bytes = resources_.memory->peakBytes();
  stats.step_seconds = step_clock.seconds();
  return stats;
}

void PipelineEngine::runProgram(const at::Tensor& inputs, const at::Tensor& targets,
                                const std::vector<std::int64_t>& sizes, PipelineStepStats& stats) {
  std::vector<std::int64_t> offsets{0};
  for (std::int64_t size : sizes) offsets.push_back(offsets.back() + size);
  // A program is receive?, compute, send? (pipeline_schedule.h): `carried` is the tensor handed
  // from each action to the next.
  at::Tensor carried;
  using Clock = std::chrono::steady_clock;
  for (std::size_t i = 0; i < program_.size(); ++i) {
    const PipelineAction& action = program_[i];
    const int m = action.micro_batch;
    const Clock::time_point start = Clock::now();
    switch (action.kind) {
      case ActionKind::kRecvActivation:
        carried = link_->receiveActivation(m);
        stats.spans.push_back({action.kind, m, start, Clock::now()});
        break;
      case ActionKind::kRecvGradient:
        carried = link_->receiveGradient(m);
        stats.spans.push_back({action.kind, m, start, Clock::now()});
        break;
      case ActionKind::kSendActivation:
        link_->sendActivation(m, carried);
        break;
      case ActionKind::kSendGradient:
        link_->sendGradient(m, carried);
        break;
      case ActionKind::kForward:
      case ActionKind::kBackward: {
        prefetchAfter(i);
        if (reducer_ && i == final_backward_) reducer_->armForFinalBackward();
        Stopwatch clock;
        std::optional<device::SpeedEmulator::ComputeScope> phase;
        if (resources_.emulator != nullptr) phase.emplace(resources_.emulator->compute());
        phase_ = phase ? &*phase : nullptr;
        if (action.kind == ActionKind::kForward) {
          const at::Tensor input =
              position_.stage == 0 ? rowsOf(inputs, offsets[m], sizes[m]) : carried;
          carried = runner_->forward(m, input, rowsOf(targets, offsets[m], sizes[m]));
        } else {
          carried = runner_->backward(m, carried);
          if (phase) releaseHeldBuckets(*phase);
        }
        phase_ = nullptr;
        if (phase) phase->end();
        stats.compute_seconds += clock.seconds();
        stats.spans.push_back({action.kind, m, start, Clock::now()});
        break;
      }
    }
  }
}

// Posts the next receive of the program before a compute action starts, so the transfer runs
// while this stage computes.
void PipelineEngine::prefetchAfter(std::size_t index) {
  for (std::size_t j = index + 1; j < program_.size(); ++j) {
    const PipelineAction& action = program_[j];
    if (action.kind == ActionKind::kRecvActivation)
      return link_->postActivation(action.micro_batch);
    if (action.kind == ActionKind::kRecvGradient) return link_->postGradient(action.micro_batch);
  }
}

void PipelineEngine::releaseHeldBuckets(device::SpeedEmulator::ComputeScope& phase) {
  for (const double compute : held_at_) {
    phase.padTo(compute);
    reducer_->launchNextHeld();
  }
  held_at_.clear();
}

// With replicas, the reducer launched the buckets during the last backward; finish() sends what
// is left, waits, and writes sum / B. Alone, the stage's sums are the global batch's.
void PipelineEngine::synchronizeGradients(PipelineStepStats& stats) {
  Stopwatch clock;
  stats.sync_start = std::chrono::steady_clock::now();
  torch::NoGradGuard no_grad;
  if (reducer_) {
    reducer_->finish(options_.global_batch);
    stats.sync_buckets = reducer_->numBuckets();
    stats.sync_buckets_overlapped = buckets_in_schedule_;
  } else {
    const double global_batch = static_cast<double>(options_.global_batch);
    for (at::Tensor& parameter : parameters_) {
      // A parameter the stage's layers never used still has a gradient, of zeros.
      if (!parameter.grad().defined()) parameter.mutable_grad() = at::zeros_like(parameter);
      parameter.mutable_grad().div_(global_batch);
    }
  }
  stats.sync_seconds = clock.seconds();
  stats.sync_end = reducer_ ? std::chrono::steady_clock::now() : stats.sync_start;
  stats.gradients_finite = gradientsFinite();
}

bool PipelineEngine::gradientsFinite() const {
  if (reducer_) return reducer_->gradientsFinite();
  for (const at::Tensor& parameter : parameters_)
    if (!at::isfinite(parameter.grad()).all().item<bool>()) return false;
  return true;
}

}  // namespace chorus::parallel
