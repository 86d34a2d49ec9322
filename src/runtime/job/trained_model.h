// Private to runtime: the model config the trainer builds, which the planner (auto_plan.cc), its
// inputs (auto_plan_inputs.cc) and the checks of a job (job_plan.cc, job_validation.cc) price.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>

#include "chorus/model/model_config.h"
#include "chorus/runtime/job/job_config.h"

namespace chorus::runtime {

// The model config the trainer builds for `job` (training_data.cc): the data set decides the
// input shape, classes and vocabulary (reading the text corpus). Throws ConfigError.
model::ModelConfig trainedModelConfig(const JobConfig& job);

// Synthetic inputs and targets of `config`'s shape for `samples` samples, all zeros: what the
// measurements of a model (its memory, its compute) run it on; neither depends on the values.
struct SyntheticBatch {
  at::Tensor inputs, targets;
};
SyntheticBatch syntheticBatch(const model::ModelConfig& config, std::int64_t samples);

// Restores the default CPU generator at the end of its scope: dropout draws from it, and a
// measurement must not shift the job's random stream (invariant 1). Not copyable.
class GeneratorGuard {
 public:
  GeneratorGuard();
  ~GeneratorGuard();
  GeneratorGuard(const GeneratorGuard&) = delete;
  GeneratorGuard& operator=(const GeneratorGuard&) = delete;

 private:
  at::Generator generator_;
  at::Tensor state_;
};

}  // namespace chorus::runtime
