#include <ATen/ATen.h>
#include <torch/utils.h>

#include <algorithm>
#include <optional>

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
  if (layout_.replicas() > 1 && resources_.stage_group)
    stage_group_ = resources_.stage_group;
  else if (layout_.replicas() > 1)
    stage_group_ =
        resources_.world->subgroup(layout_.stageGroup(s), "pipeline-stage" + std::to_string(s));
  const int previous = s > 0 ? layout_.rankOf(r, s - 1) : -1;
  const int next = s + 1 < layout_.stages() ? layout_.rankOf(r, s + 1) : -1;
  const at::Device device = parameters_.empty() ? at::Device(at::kCPU) : parameters_[0].device();
  link_ = std::make_unique<detail::StageLink>(resources_.world, previous, next, options_.timeout,
                                              device);
  runner_ = std::make_unique<detail::StageRunner>(model_, firstLayer(), lastLayer(), s == 0,
                                                  s + 1 == layout_.stages(), checkpointing());
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

PipelineStepStats PipelineEngine::step(const at::Tensor& inputs, const at::Tensor& targets) {
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
  runner_->beginStep();
  Stopwatch schedule_clock;
  runProgram(inputs, targets, sizes, stats);
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
  for (std::size_t i = 0; i < program_.size(); ++i) {
    const PipelineAction& action = program_[i];
    const int m = action.micro_batch;
    switch (action.kind) {
      case ActionKind::kRecvActivation:
        carried = link_->receiveActivation(m);
        break;
      case ActionKind::kRecvGradient:
        carried = link_->receiveGradient(m);
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
        Stopwatch clock;
        std::optional<device::SpeedEmulator::ComputeScope> phase;
        if (resources_.emulator != nullptr) phase.emplace(resources_.emulator->compute());
        if (action.kind == ActionKind::kForward) {
          const at::Tensor input =
              position_.stage == 0 ? rowsOf(inputs, offsets[m], sizes[m]) : carried;
          carried = runner_->forward(m, input, rowsOf(targets, offsets[m], sizes[m]));
        } else {
          carried = runner_->backward(m, carried);
        }
        if (phase) phase->end();
        stats.compute_seconds += clock.seconds();
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

void PipelineEngine::synchronizeGradients(PipelineStepStats& stats) {
  Stopwatch clock;
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> gradients;
  for (at::Tensor& parameter : parameters_) {
    // A parameter the stage's layers never used still takes part, as zeros.
    if (!parameter.grad().defined()) parameter.mutable_grad() = at::zeros_like(parameter);
    gradients.push_back(parameter.grad());
  }
  const double global_batch = static_cast<double>(options_.global_batch);
  if (stage_group_ && !gradients.empty()) {
    std::vector<at::Tensor> flat_views;
    for (const at::Tensor& gradient : gradients) flat_views.push_back(gradient.reshape({-1}));
    at::Tensor flat = at::cat(flat_views);
    comm::OpOptions options;
    options.timeout = options_.timeout;
    stage_group_->allReduce(flat, comm::ReduceOp::kSum, options).wait();
    flat.div_(global_batch);
    std::int64_t offset = 0;
    for (at::Tensor& gradient : gradients) {
      gradient.copy_(flat.narrow(0, offset, gradient.numel()).view_as(gradient));
      offset += gradient.numel();
    }
  } else {
    for (at::Tensor& gradient : gradients) gradient.div_(global_batch);
  }
  stats.sync_seconds = clock.seconds();
}

}  // namespace chorus::parallel
