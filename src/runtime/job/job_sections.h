// Private to runtime: readers of the job config's newer sections (precision, checkpoint,
// parallel), and the checks of [parallel] against the rest of the job.
#pragma once

#include "chorus/core/config.h"
#include "chorus/runtime/job/job_config.h"

namespace chorus::runtime {

PrecisionSection readPrecision(const Config& config);
CheckpointSection readCheckpoint(const Config& config);
// Each [parallel] key on its own (names, ranges, the partition's syntax).
ParallelSection readParallel(const Config& config);
// [parallel] against the other sections: the device count (unless "auto"), the global batch,
// the features a pipeline does not combine with, and the pipeline keys that plain data
// parallelism would ignore (when `config` sets them). Throws ConfigError naming the key.
void checkParallel(const JobConfig& job, const Config& config);
// plan = "auto": a key the planner sets (autoPlanKeys()) that the job sets too is a ConfigError
// naming it, since one of the two would silently lose.
void rejectPlannedKeys(const Config& config);

}  // namespace chorus::runtime
