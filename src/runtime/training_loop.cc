#include "training_loop.h"

#include <algorithm>

#include "chorus/core/clock.h"

namespace chorus::runtime {

TrainResult runTrainingLoop(const JobConfig& job, const TrainingLoop& loop,
                            const TrainerHooks& hooks) {
  const TrainSection& train = job.train;
  TrainResult result;
  Stopwatch clock;
  std::int64_t samples = 0;
  while (loop.next_step() < train.steps) {
    TrainerHooks inner = hooks;
    inner.on_step = nullptr;  // called below, after any evaluation joined the record
    StepRecord record = loop.step(inner);
    samples += train.global_batch;
    const std::int64_t done = loop.next_step();
    if ((train.eval_every > 0 && done % train.eval_every == 0) || done == train.steps) {
      const auto [accuracy, loss] = loop.evaluate(-1);
      record.test_accuracy = accuracy;
      record.test_loss = loss;
    }
    if (loop.on_record) loop.on_record(record);
    if (hooks.on_step) hooks.on_step(record);
    result.final_loss = record.loss;
    result.steps = done;
    if (record.stop_requested) {
      result.interrupted = true;
      break;
    }
    if (train.target_accuracy > 0 && record.test_accuracy &&
        *record.test_accuracy >= train.target_accuracy) {
      result.reached_target = true;
      break;
    }
    loop.checkpoint(false);
  }
  // The state after the last step: at the end (when configured), or when asked to stop.
  loop.checkpoint(result.interrupted || job.checkpoint.at_end);
  result.last_checkpoint = loop.finish_checkpoints();
  if (!result.interrupted) result.test_accuracy = loop.evaluate(0).first;
  result.wall_seconds = clock.seconds();
  result.samples_per_second = samples / std::max(result.wall_seconds, 1e-9);
  return result;
}

std::pair<double, double> evaluationResult(const at::Tensor& totals) {
  const double correct = totals[0].item<double>(), predictions = totals[1].item<double>();
  const double loss = totals[2].item<double>(), samples = totals[3].item<double>();
  return {predictions > 0 ? correct / predictions : 0.0, samples > 0 ? loss / samples : 0.0};
}

}  // namespace chorus::runtime
