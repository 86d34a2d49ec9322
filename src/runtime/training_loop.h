// Private to runtime: the outer loop both trainers share — steps, evaluations, the stop on request
// or at the target accuracy, periodic and final checkpoints, the final whole-split evaluation.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "chorus/runtime/job_config.h"
#include "chorus/runtime/trainer.h"

namespace chorus::runtime {

// What the loop needs of a trainer. Every member is required except on_record.
struct TrainingLoop {
  std::function<std::int64_t()> next_step;
  std::function<StepRecord(const TrainerHooks&)> step;
  // Accuracy and mean loss on `samples` test samples (-1: train.eval_samples; 0: all).
  std::function<std::pair<double, double>(std::int64_t samples)> evaluate;
  // Writes a checkpoint when one is due after the last step (now, when the argument is true).
  std::function<void(bool final_or_requested)> checkpoint;
  // Waits for checkpoint writes in flight; returns the newest checkpoint's path ("" if none).
  std::function<std::string()> finish_checkpoints;
  // Called with each record before the caller's on_step hook (logs). Default: none.
  std::function<void(const StepRecord&)> on_record;
};

// Runs the job's steps until train.steps, the target accuracy, or a stop request.
TrainResult runTrainingLoop(const JobConfig& job, const TrainingLoop& loop,
                            const TrainerHooks& hooks);

// Accuracy and mean loss from all-reduced evaluation totals {correct, predictions, summed loss,
// samples} (kDouble).
std::pair<double, double> evaluationResult(const at::Tensor& totals);

}  // namespace chorus::runtime
