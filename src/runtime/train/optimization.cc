// Optimizers, the learning-rate schedule, and the micro-batch a memory budget allows.
#include <cmath>

#include "chorus/core/error.h"
#include "chorus/core/units.h"
#include "train/trainer_state.h"

namespace chorus::runtime {

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const OptimizerSection& options,
                                                       std::vector<at::Tensor> parameters) {
  if (options.name == "adamw") {
    torch::optim::AdamWOptions adamw(options.lr);
    adamw.betas({options.beta1, options.beta2}).weight_decay(options.weight_decay);
    return std::make_unique<torch::optim::AdamW>(std::move(parameters), adamw);
  }
  torch::optim::SGDOptions sgd(options.lr);
  sgd.momentum(options.momentum).weight_decay(options.weight_decay);
  return std::make_unique<torch::optim::SGD>(std::move(parameters), sgd);
}

double learningRateAt(const OptimizerSection& options, std::int64_t step, std::int64_t steps) {
  if (options.warmup_steps > 0 && step < options.warmup_steps)
    return options.lr * static_cast<double>(step + 1) / static_cast<double>(options.warmup_steps);
  if (options.schedule == "constant") return options.lr;
  const double span = static_cast<double>(std::max<std::int64_t>(1, steps - options.warmup_steps));
  const double progress = std::min(1.0, static_cast<double>(step - options.warmup_steps) / span);
  const double floor = options.lr * options.min_lr_ratio;
  return floor + (options.lr - floor) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

void setLearningRate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace chorus::runtime
