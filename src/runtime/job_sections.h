// Private to runtime: readers of the job config's newer sections (precision, checkpoint).
#pragma once

#include "chorus/core/config.h"
#include "chorus/runtime/job_config.h"

namespace chorus::runtime {

PrecisionSection readPrecision(const Config& config);
CheckpointSection readCheckpoint(const Config& config);

}  // namespace chorus::runtime
