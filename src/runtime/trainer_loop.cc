// The outer loop of the Trainer: steps, evaluations, the stop at the target accuracy.
#include <ATen/ATen.h>
#include <torch/torch.h>

#include "chorus/core/clock.h"
#include "chorus/core/logging.h"
#include "chorus/observe/trace_recorder.h"
#include "trainer_state.h"
#include "training_loop.h"

namespace chorus::runtime {
namespace {

using TraceClock = observe::TraceRecorder::Clock;

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
  return evaluationResult(totals);
}

TrainResult Trainer::run(const TrainerHooks& hooks) {
  State& s = *state_;
  TrainingLoop loop;
  loop.next_step = [&s] { return s.next_step; };
  loop.step = [this](const TrainerHooks& inner) { return step(inner); };
  // Evaluations and checkpoints go on the timeline of the step they follow.
  observe::TraceRecorder* trace = hooks.trace;
  const auto traced = [trace](const char* name, TraceClock::time_point start) {
    if (trace != nullptr)
      trace->span(observe::Track::kCompute, name, name, start, TraceClock::now());
  };
  loop.evaluate = [this, traced](std::int64_t samples) {
    const auto start = TraceClock::now();
    const auto result = evaluate(samples);
    traced("evaluation", start);
    return result;
  };
  loop.checkpoint = [&s, traced](bool final_or_requested) {
    const auto start = TraceClock::now();
    if (writeCheckpointIfDue(s, final_or_requested)) traced("checkpoint", start);
  };
  loop.finish_checkpoints = [&s] {
    finishPendingCheckpoint(s);
    return s.last_checkpoint_path;
  };
  // Every rank decides the same change; one of them says so.
  loop.on_record = [&s](const StepRecord& record) {
    if (!record.rebalance.empty() && s.worker->rank() == 0) logInfo("balancer: ", record.rebalance);
  };
  TrainResult result = runTrainingLoop(s.job, loop, hooks);
  result.skipped_steps = s.skipped_steps;
  return result;
}

}  // namespace chorus::runtime
