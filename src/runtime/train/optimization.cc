// Optimizers, the learning-rate schedule, and the memory arithmetic that sizes micro-batches.
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

std::int64_t maxMicroBatch(const model::ZooModel& model, const OptimizerSection& optimizer,
                           std::uint64_t budget_bytes, const std::string& device) {
  std::int64_t parameters = 0, activations = 0;
  for (const auto& layer : model.profile()) {
    parameters += layer.parameters;
    activations += layer.activation_bytes;
  }
  // Weights are allocated before the budget is enforced; what training allocates under it:
  // gradients, the reducer's buckets and the optimizer's state (1 tensor per parameter for SGD
  // with momentum, 2 for AdamW), all fp32.
  const std::int64_t states = optimizer.name == "adamw" ? 2 : 1;
  const std::int64_t fixed = parameters * 4 * (2 + states);
  // Autograd keeps several tensors per layer output alive for backward; 6 x the outputs covers
  // the zoo's layers (inputs, pre-activations, normalization statistics) with margin.
  const std::int64_t per_sample = std::max<std::int64_t>(1, 6 * activations);
  const std::int64_t room = static_cast<std::int64_t>(budget_bytes) - fixed;
  if (room < per_sample)
    CHORUS_THROW(
        ConfigError, "device '", device, "': the memory budget of ", formatBytes(budget_bytes),
        " cannot hold one training sample of this model (needs ",
        formatBytes(static_cast<std::uint64_t>(fixed + per_sample)), ": ",
        formatBytes(static_cast<std::uint64_t>(fixed)), " for gradients and optimizer state, ",
        formatBytes(static_cast<std::uint64_t>(per_sample)), " per sample)");
  return room / per_sample;
}

}  // namespace chorus::runtime
