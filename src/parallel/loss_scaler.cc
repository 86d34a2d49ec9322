#include "chorus/parallel/loss_scaler.h"

#include <ATen/ATen.h>

#include "chorus/core/error.h"

namespace chorus::parallel {

DynamicLossScaler::DynamicLossScaler(LossScalerOptions options) : options_(options) {
  CHORUS_CHECK_CONFIG(options_.init_scale > 0, "loss scale: init_scale must be positive");
  CHORUS_CHECK_CONFIG(options_.growth_factor > 1, "loss scale: growth_factor must be > 1");
  CHORUS_CHECK_CONFIG(options_.backoff_factor > 0 && options_.backoff_factor < 1,
                      "loss scale: backoff_factor must be in (0, 1)");
  CHORUS_CHECK_CONFIG(options_.growth_interval >= 1, "loss scale: growth_interval must be >= 1");
  state_.scale = options_.init_scale;
}

void DynamicLossScaler::update(bool overflow) {
  if (overflow) {
    state_.scale *= options_.backoff_factor;
    state_.clean_steps = 0;
    return;
  }
  if (++state_.clean_steps >= options_.growth_interval) {
    state_.scale *= options_.growth_factor;
    state_.clean_steps = 0;
  }
}

void DynamicLossScaler::loadState(const LossScalerState& state) {
  CHORUS_CHECK_CONFIG(state.scale > 0 && state.clean_steps >= 0,
                      "loss scale state: scale must be positive, clean steps >= 0");
  state_ = state;
}

GradientUnscaler::GradientUnscaler(std::vector<at::Tensor> parameters)
    : parameters_(std::move(parameters)) {
  for (auto& parameter : parameters_) {
    if (!parameter.requires_grad()) continue;
    hook_ids_.push_back(parameter.register_hook([this](const at::Tensor& grad) {
      at::Tensor unscaled = grad * inverse_scale_;
      // Counted on the device, read once per step: no synchronization per gradient.
      at::Tensor bad = at::logical_not(at::isfinite(unscaled)).any();
      if (!nonfinite_.defined() || nonfinite_.device() != bad.device())
        nonfinite_ = at::zeros({}, bad.options().dtype(at::kInt));
      nonfinite_.add_(bad);
      return unscaled;
    }));
  }
}

GradientUnscaler::~GradientUnscaler() {
  size_t k = 0;
  for (auto& parameter : parameters_)
    if (parameter.requires_grad() && k < hook_ids_.size()) parameter.remove_hook(hook_ids_[k++]);
}

void GradientUnscaler::beginStep(double scale) {
  inverse_scale_ = 1.0 / scale;
  if (nonfinite_.defined()) nonfinite_.zero_();
}

bool GradientUnscaler::overflowed() const {
  return nonfinite_.defined() && nonfinite_.item<int>() > 0;
}

}  // namespace chorus::parallel
