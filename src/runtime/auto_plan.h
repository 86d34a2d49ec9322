// Private to runtime: what plan = "auto" shares between its inputs (auto_plan_inputs.cc) and the
// planning itself (auto_plan.cc).
#pragma once

#include "chorus/model/model_config.h"
#include "chorus/runtime/job_config.h"

namespace chorus::runtime {

// The model config the trainer builds for `job` (training_data.cc): the data set decides the
// input shape, classes and vocabulary (reading the text corpus). Throws ConfigError.
model::ModelConfig trainedModelConfig(const JobConfig& job);

}  // namespace chorus::runtime
