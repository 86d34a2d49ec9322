// The data-parallel engine's evaluation: every rank its slice of the test samples, the totals
// all-reduced.
#include <ATen/ATen.h>
#include <torch/torch.h>

#include "train/data_parallel_engine.h"

namespace chorus::runtime {
namespace {

// The first `limit` test samples (all when 0), dealt to ranks in contiguous, nearly equal slices:
// rank `rank`'s slice [first, second).
std::pair<std::int64_t, std::int64_t> evaluationRange(std::int64_t test_size, std::int64_t limit,
                                                      int rank, int world) {
  const std::int64_t total = limit > 0 ? std::min(limit, test_size) : test_size;
  return {total * rank / world, total * (rank + 1) / world};
}

std::vector<std::int64_t> evaluationIds(std::int64_t test_size, std::int64_t limit, int rank,
                                        int world) {
  const auto [begin, end] = evaluationRange(test_size, limit, rank, world);
  std::vector<std::int64_t> ids;
  for (std::int64_t id = begin; id < end; ++id) ids.push_back(id);
  return ids;
}

// Inference needs less memory than a training micro-batch of the same size.
std::int64_t evaluationChunk(std::int64_t micro_limit) {
  return micro_limit > 0 ? std::min<std::int64_t>(256, micro_limit) : 256;
}

std::int64_t passesFor(std::int64_t samples, std::int64_t chunk) {
  return (samples + chunk - 1) / chunk;
}

}  // namespace

// The forward passes of this rank's evaluation: its samples in chunks; under ZeRO-3 as many as
// the rank that needs the most (every pass gathers each layer from all ranks), so some are empty.
std::int64_t DataParallelEngine::evaluationPasses(std::int64_t test_size,
                                                  std::int64_t limit) const {
  const int world = worker_->worldSize();
  const auto passesOf = [&](int rank, std::int64_t micro_limit) {
    const auto [begin, end] = evaluationRange(test_size, limit, rank, world);
    return passesFor(end - begin, evaluationChunk(micro_limit));
  };
  if (!zero_layers_) return passesOf(worker_->rank(), micro_limit_);
  std::int64_t passes = 0;
  for (int rank = 0; rank < world; ++rank)
    passes = std::max(passes, passesOf(rank, micro_limits_.at(rank)));
  return passes;
}

std::pair<double, double> DataParallelEngine::evaluate(std::int64_t samples) {
  requireGatheredParameters();
  comm::Communicator& world = *worker_->world();
  torch::NoGradGuard no_grad;
  model_->eval();
  const std::int64_t limit = samples < 0 ? job_.train.eval_samples : samples;
  const auto ids = evaluationIds(data_.test->size(), limit, world.rank(), world.size());
  // correct predictions, predictions, summed loss, samples
  at::Tensor totals = at::zeros({4}, at::kDouble);
  const std::int64_t chunk = evaluationChunk(micro_limit_);
  const std::int64_t passes = evaluationPasses(data_.test->size(), limit);
  for (std::int64_t pass = 0; pass < passes; ++pass) {
    const size_t begin = std::min(ids.size(), static_cast<size_t>(pass * chunk));
    const std::vector<std::int64_t> part(
        ids.begin() + begin,
        ids.begin() + std::min(ids.size(), begin + static_cast<size_t>(chunk)));
    const data::Batch batch = data_.test->get(part);
    const at::Tensor targets = batch.targets.to(worker_->device());
    at::Tensor outputs;
    {
      parallel::AutocastScope autocast(worker_->device().type(), compute_precision_);
      outputs = forward(batch.inputs.to(worker_->device()));
    }
    totals[0] += static_cast<double>(model_->correct(outputs, targets));
    totals[1] += static_cast<double>(targets.numel());
    totals[2] += model_->lossSum(outputs, targets).item<double>();
    totals[3] += static_cast<double>(part.size());
  }
  world.allReduce(totals).wait();
  return evaluationResult(totals);
}

}  // namespace chorus::runtime
