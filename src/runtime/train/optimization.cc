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

std::int64_t maxMicroBatch(const plan::MemoryModel& memory, plan::Dtype dtype,
                           std::uint64_t budget_bytes, const std::string& device, int zero_stage,
                           int group, double shard_fraction, double replica_fraction) {
  // The whole model on one rank, as if accumulating (gradients held through backward): the limit
  // must serve every share the balancer may give the rank.
  const int layers = memory.model().layerCount();
  plan::StageMemoryRequest request =
      plan::trainerStageRequest(0, layers, layers, dtype, 1, 1, /*micro_batches=*/2, zero_stage,
                                group, plan::Checkpointing::kNone);
  request.shard_fraction = shard_fraction;
  request.replica_fraction = replica_fraction;
  // A tenth of the budget spare: the model is within 15% of the measured peak (MemoryPrediction
  // in the runtime tests), and running out of a budget fails the step.
  const double budget = 0.9 * static_cast<double>(budget_bytes);
  // No micro-batch is larger than the largest share a rank can be given.
  constexpr std::int64_t kLimit = std::int64_t{1} << 40;
  const std::int64_t fits = memory.largestMicroBatch(request, budget, kLimit);
  if (fits < 1) {
    request.micro_batch = 0;
    const double fixed = memory.peakBytes(request);
    request.micro_batch = 1;
    const double one = memory.peakBytes(request);
    CHORUS_THROW(ConfigError, "device '", device, "': the memory budget of ",
                 formatBytes(budget_bytes),
                 " cannot hold one training sample of this model (needs ",
                 formatBytes(static_cast<std::uint64_t>(one)),
                 " and a tenth spare: ", formatBytes(static_cast<std::uint64_t>(fixed)),
                 " for weights, gradients and optimizer state, ",
                 formatBytes(static_cast<std::uint64_t>(one - fixed)), " per sample)");
  }
  return fits;
}

double replicaFraction(const ZeroSection& zero, const std::vector<double>& shards, int rank,
                       int ranks) {
  if (zero.stage == 0 || zero.redundancy == 0 || ranks < 2) return 0;
  const int successor = (rank + 1) % ranks;
  return shards.empty() ? 1.0 / ranks : shards.at(successor);
}

}  // namespace chorus::runtime
