// The outer loop of the Trainer: steps, evaluations, the stop at the target accuracy.
#include <ATen/ATen.h>
#include <torch/torch.h>

#include "chorus/core/clock.h"
#include "chorus/core/logging.h"
#include "trainer_state.h"

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

std::pair<double, double> Trainer::evaluate(std::int64_t samples) {
  State& s = *state_;
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
      parallel::AutocastScope autocast(s.worker->device().type(), s.precision);
      outputs = s.model->forward(batch.inputs.to(s.worker->device()));
    }
    totals[0] += static_cast<double>(s.model->correct(outputs, targets));
    totals[1] += static_cast<double>(targets.numel());
    totals[2] += s.model->lossSum(outputs, targets).item<double>();
    totals[3] += static_cast<double>(part.size());
  }
  world.allReduce(totals).wait();
  const double accuracy =
      totals[1].item<double>() > 0 ? totals[0].item<double>() / totals[1].item<double>() : 0.0;
  const double loss =
      totals[3].item<double>() > 0 ? totals[2].item<double>() / totals[3].item<double>() : 0.0;
  return {accuracy, loss};
}

TrainResult Trainer::run(const TrainerHooks& hooks) {
  State& s = *state_;
  const TrainSection& train = s.job.train;
  TrainResult result;
  Stopwatch clock;
  std::int64_t samples = 0;
  while (s.next_step < train.steps) {
    TrainerHooks inner = hooks;
    inner.on_step = nullptr;  // called below, after any evaluation joined the record
    StepRecord record = step(inner);
    samples += train.global_batch;
    const bool last = s.next_step == train.steps;
    if ((train.eval_every > 0 && s.next_step % train.eval_every == 0) || last) {
      const auto [accuracy, loss] = evaluate();
      record.test_accuracy = accuracy;
      record.test_loss = loss;
    }
    // Every rank decides the same change; one of them says so.
    if (!record.rebalance.empty() && s.worker->rank() == 0) logInfo("balancer: ", record.rebalance);
    if (hooks.on_step) hooks.on_step(record);
    result.final_loss = record.loss;
    result.steps = s.next_step;
    if (record.stop_requested) {
      result.interrupted = true;
      break;
    }
    if (train.target_accuracy > 0 && record.test_accuracy &&
        *record.test_accuracy >= train.target_accuracy) {
      result.reached_target = true;
      break;
    }
    writeCheckpointIfDue(s, false);
  }
  // The state after the last step: at the end, or when asked to stop.
  writeCheckpointIfDue(s, result.interrupted || s.job.checkpoint.at_end);
  finishPendingCheckpoint(s);
  result.last_checkpoint = s.last_checkpoint_path;
  result.skipped_steps = s.skipped_steps;
  if (result.interrupted) {
    result.wall_seconds = clock.seconds();
    result.samples_per_second = samples / std::max(result.wall_seconds, 1e-9);
    return result;
  }
  result.test_accuracy = evaluate(0).first;
  result.wall_seconds = clock.seconds();
  result.samples_per_second = samples / std::max(result.wall_seconds, 1e-9);
  return result;
}

}  // namespace chorus::runtime
