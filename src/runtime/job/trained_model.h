// Private to runtime: the model config the trainer builds, which the planner (auto_plan.cc), its
// inputs (auto_plan_inputs.cc) and the checks of a job (job_plan.cc, job_validation.cc) price.
#pragma once

#include "chorus/model/model_config.h"
#include "chorus/runtime/job/job_config.h"

namespace chorus::runtime {

// The model config the trainer builds for `job` (training_data.cc): the data set decides the
// input shape, classes and vocabulary (reading the text corpus). Throws ConfigError.
model::ModelConfig trainedModelConfig(const JobConfig& job);

}  // namespace chorus::runtime
