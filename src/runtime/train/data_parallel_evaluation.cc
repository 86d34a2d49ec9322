// The data-parallel engine's evaluation: every rank its slice of the test samples, the totals
// all-reduced.
#include <ATen/ATen.h>
#include <torch/torch.h>

#include "train/data_parallel_engine.h"

namespace chorus::runtime {
namespace {

// The first `limit` test samples (all when 0), dealt to ranks in contiguous, nearly equal slices.
std::vector<std::int64_t> evaluationIds(std::int64_t test_size, std::int64_t limit, int rank,
                                        int world) {
  const std::int64_t total = limit > 0 ? std::min(limit, test_size) : test_size;
  const std::int64_t begin = total * rank / world, end = total * (rank + 1) / world;
  std::vector<std::int64_t> ids;
  for (std::int64_t id = begin; id < end; ++id) ids.push_back(id);
  return ids;
}

}  // namespace

std::pair<double, double> DataParallelEngine::evaluate(std::int64_t samples) {
  DataParallelEngine& s = *this;
  comm::Communicator& world = *s.worker->world();
  torch::NoGradGuard no_grad;
  s.model->eval();
  const auto ids =
      evaluationIds(s.data.test->size(), samples < 0 ? s.job.train.eval_samples : samples,
                    world.rank(), world.size());
  // correct predictions, predictions, summed loss, samples
  at::Tensor totals = at::zeros({4}, at::kDouble);
  // Inference needs less memory than a training micro-batch of the same size.
  const std::int64_t chunk = s.micro_limit > 0 ? std::min<std::int64_t>(256, s.micro_limit) : 256;
  for (size_t begin = 0; begin < ids.size(); begin += static_cast<size_t>(chunk)) {
    const std::vector<std::int64_t> part(
        ids.begin() + begin,
        ids.begin() + std::min(ids.size(), begin + static_cast<size_t>(chunk)));
    const data::Batch batch = s.data.test->get(part);
    const at::Tensor targets = batch.targets.to(s.worker->device());
    at::Tensor outputs;
    {
      parallel::AutocastScope autocast(s.worker->device().type(), s.compute_precision);
      outputs = s.model->forward(batch.inputs.to(s.worker->device()));
    }
    totals[0] += static_cast<double>(s.model->correct(outputs, targets));
    totals[1] += static_cast<double>(targets.numel());
    totals[2] += s.model->lossSum(outputs, targets).item<double>();
    totals[3] += static_cast<double>(part.size());
  }
  world.allReduce(totals).wait();
  return evaluationResult(totals);
}

}  // namespace chorus::runtime
