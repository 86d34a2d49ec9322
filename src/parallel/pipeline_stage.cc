#include "pipeline_stage.h"

#include <ATen/Context.h>
#include <torch/autograd.h>
#include <torch/utils.h>

#include <mutex>

#include <algorithm>
#include <limits>

#include "chorus/core/error.h"

namespace chorus::parallel::detail {
namespace {

std::uint64_t bytesOf(const at::Tensor& tensor) {
  return tensor.defined() ? static_cast<std::uint64_t>(tensor.nbytes()) : 0;
}

at::Tensor generatorState(c10::Device device) {
  at::Generator generator = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void setGeneratorState(c10::Device device, const at::Tensor& state) {
  at::Generator generator = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

// Runs a recompute with the generators as they were at its original forward, and puts them back
// afterwards, so the recompute neither changes the masks nor the draws of later forwards.
template <typename Body>
void withRngOf(const RngState& saved, Body&& body) {
  const RngState now = RngState::capture(saved.where);
  saved.restore();
  body();
  now.restore();
}

}  // namespace

RngState RngState::capture(c10::Device device) {
  RngState state;
  state.where = device;
  state.cpu = generatorState(c10::Device(c10::kCPU));
  if (!device.is_cpu()) state.device = generatorState(device);
  return state;
}

void RngState::restore() const {
  setGeneratorState(c10::Device(c10::kCPU), cpu);
  if (device.defined()) setGeneratorState(where, device);
}

StageRunner::StageRunner(std::shared_ptr<model::ZooModel> model, int first, int last, bool is_first,
                         bool is_last, Checkpointing checkpointing, Precision precision,
                         at::ScalarType wire)
    : model_(std::move(model)),
      first_(first),
      last_(last),
      is_first_(is_first),
      is_last_(is_last),
      checkpointing_(checkpointing),
      precision_(precision),
      wire_(wire) {
  CHORUS_CHECK_CONFIG(model_ != nullptr, "a pipeline stage needs a model");
  CHORUS_CHECK_CONFIG(0 <= first && first < last && last <= model_->numLayers(),
                      "pipeline stage layers [", first, ", ", last, ") are not a non-empty range ",
                      "of the model's ", model_->numLayers(), " layers");
}

void StageRunner::beginStep(double loss_scale, int inject_overflow) {
  if (!held_.empty())
    CHORUS_THROW(ConfigError, "pipeline stage: a step began with ", held_.size(),
                 " micro-batches of the last one never back-propagated");
  CHORUS_CHECK_CONFIG(loss_scale > 0, "pipeline stage: loss scale ", loss_scale,
                      " is not positive");
  loss_scale_ = loss_scale;
  inject_overflow_ = inject_overflow;
  loss_sum_ = 0;
  held_bytes_ = 0;
  peak_held_bytes_ = 0;
}

// The input as a leaf of this stage's graph. Only activations from another stage need their
// gradient (the model input of the first stage does not), and only floating-point ones can.
at::Tensor StageRunner::leafOf(const at::Tensor& input, bool needs_gradient) const {
  at::Tensor leaf = input.detach();
  if (needs_gradient && leaf.is_floating_point()) leaf.requires_grad_(true);
  return leaf;
}

at::Tensor StageRunner::arrived(const at::Tensor& input) const {
  return input.is_floating_point() ? input.to(at::kFloat) : input;
}

at::Tensor StageRunner::lossOf(const at::Tensor& output, const at::Tensor& targets) {
  AutocastScope autocast(output.device().type(), precision_);
  return model_->lossSum(output, targets);
}

at::Tensor StageRunner::runLayers(int first, int last, const at::Tensor& x) {
  AutocastScope autocast(x.device().type(), precision_);
  return model_->forwardRange(first, last, x);
}

double StageRunner::seedFactor(int micro_batch) const {
  return micro_batch == inject_overflow_ ? std::numeric_limits<double>::infinity() : loss_scale_;
}

at::Tensor StageRunner::seeded(const at::Tensor& gradient, at::ScalarType dtype,
                               int micro_batch) const {
  const double factor = seedFactor(micro_batch);
  if (factor == 1.0) return gradient.scalar_type() == dtype ? gradient : gradient.to(dtype);
  return (gradient.to(at::kFloat) * factor).to(dtype);
}

at::Tensor StageRunner::unscaled(const at::Tensor& gradient) const {
  if (!gradient.defined() || loss_scale_ == 1.0) return gradient;
  return gradient / loss_scale_;
}

void StageRunner::hold(int micro_batch, Held held) {
  held.bytes = bytesOf(held.input) + bytesOf(held.output) + bytesOf(held.targets);
  for (const at::Tensor& boundary : held.boundaries) held.bytes += bytesOf(boundary);
  held_bytes_ += held.bytes;
  peak_held_bytes_ = std::max(peak_held_bytes_, held_bytes_);
  if (!held_.emplace(micro_batch, std::move(held)).second)
    CHORUS_THROW(ConfigError, "pipeline stage: micro-batch ", micro_batch, " forwarded twice");
}

at::Tensor StageRunner::forward(int micro_batch, const at::Tensor& input,
                                const at::Tensor& targets) {
  CHORUS_CHECK_CONFIG(input.defined(), "pipeline stage: micro-batch ", micro_batch,
                      " has no input");
  CHORUS_CHECK_CONFIG(!is_last_ || targets.defined(), "the last pipeline stage needs targets");
  Held held;
  if (is_last_) held.targets = targets;
  at::Tensor output;
  if (checkpointing_ == Checkpointing::kNone) {
    held.input = leafOf(arrived(input), !is_first_);
    output = runLayers(first_, last_, held.input);
  } else {
    torch::NoGradGuard no_grad;
    held.input = input.detach();  // as it arrived: a 16-bit activation is kept in 16 bits
    at::Tensor x = arrived(held.input);
    if (checkpointing_ == Checkpointing::kStage) held.rng.push_back(RngState::capture(x.device()));
    for (int layer = first_; layer < last_; ++layer) {
      if (checkpointing_ == Checkpointing::kLayer) {
        held.boundaries.push_back(x);
        held.rng.push_back(RngState::capture(x.device()));
      }
      x = runLayers(layer, layer + 1, x);
    }
    output = x;
    if (checkpointing_ == Checkpointing::kLayer) held.input = at::Tensor();  // boundaries[0]
  }
  at::Tensor to_send;
  if (is_last_) {
    at::Tensor loss = lossOf(output, targets);
    loss_sum_ += loss.item<double>();
    if (checkpointing_ == Checkpointing::kNone) held.output = loss;
  } else {
    to_send = output.detach();
    if (to_send.is_floating_point() && to_send.scalar_type() != wire_) to_send = to_send.to(wire_);
    if (checkpointing_ == Checkpointing::kNone) held.output = output;
  }
  hold(micro_batch, std::move(held));
  return to_send;
}

// Checkpointed backward, layer by layer from the last: each layer's forward is re-run from its
// kept input with autograd on, and back-propagated at once, so one layer's graph lives at a time.
// kStage is the same with the whole stage as one "layer".
at::Tensor StageRunner::backwardLayers(int micro_batch, Held held, at::Tensor gradient) {
  std::vector<std::pair<int, int>> ranges;
  std::vector<at::Tensor> inputs;
  if (checkpointing_ == Checkpointing::kStage) {
    inputs.push_back(std::move(held.input));
    ranges.emplace_back(first_, last_);
  } else {
    inputs = std::move(held.boundaries);
    for (int layer = first_; layer < last_; ++layer) ranges.emplace_back(layer, layer + 1);
  }
  const at::Tensor targets = std::move(held.targets);
  for (int k = static_cast<int>(ranges.size()) - 1; k >= 0; --k) {
    const bool needs_gradient = k > 0 || !is_first_;
    // The stage's input arrives as fp32 at the first layer, as in forward(); a kLayer boundary
    // was kept as the layer before produced it.
    const at::Tensor x = leafOf(k == 0 ? arrived(inputs[k]) : inputs[k], needs_gradient);
    inputs[k] = at::Tensor();  // the recomputed graph holds it now, and frees it with itself
    at::Tensor y;
    withRngOf(held.rng.at(k), [&] { y = runLayers(ranges[k].first, ranges[k].second, x); });
    const bool top = k + 1 == static_cast<int>(ranges.size());
    if (is_last_ && top)
      (lossOf(y, targets) * seedFactor(micro_batch)).backward();
    else
      y.backward(top ? seeded(gradient, y.scalar_type(), micro_batch) : gradient);
    gradient = needs_gradient ? x.grad() : at::Tensor();
  }
  return unscaled(gradient);
}

at::Tensor StageRunner::backward(int micro_batch, const at::Tensor& output_gradient) {
  auto found = held_.find(micro_batch);
  if (found == held_.end())
    CHORUS_THROW(ConfigError, "pipeline stage: backward of micro-batch ", micro_batch,
                 " before its forward");
  CHORUS_CHECK_CONFIG(is_last_ || output_gradient.defined(), "pipeline stage: micro-batch ",
                      micro_batch, " needs the next stage's gradient");
  Held held = std::move(found->second);
  held_.erase(found);
  held_bytes_ -= held.bytes;
  if (checkpointing_ != Checkpointing::kNone)
    return backwardLayers(micro_batch, std::move(held), output_gradient);
  if (is_last_) {
    const double factor = seedFactor(micro_batch);
    if (factor == 1.0)
      held.output.backward();
    else
      (held.output * factor).backward();
  } else {
    held.output.backward(seeded(output_gradient, held.output.scalar_type(), micro_batch));
  }
  return is_first_ ? at::Tensor() : unscaled(held.input.grad());
}

}  // namespace chorus::parallel::detail
