// Plans fixed by hand rather than searched: the exact split of a run someone made, so the cost
// model and the simulator can predict that very run and be compared with its measured step time
// (`chorus plan --shares` / `--cuts`, bench/plan_validation.py).
//
// Both builders use every device of the cluster in order (rank i on device i), ZeRO 0 and a ring
// all-reduce (what `chorus train` runs), and return the plan priced: `predicted`, each rank's
// `predicted_memory` and a reason saying it was fixed. A plan that does not fit memory is still
// returned, with the reason saying which rank does not fit.
#pragma once

#include <vector>

#include "chorus/plan/cost_model.h"
#include "chorus/plan/plan.h"

namespace chorus::plan {

// Heterogeneous data parallelism with `shares[i]` samples on device i, in micro-batches of at most
// `micro_batch` samples (0: each share in one pass, as `chorus train` with train.micro_batch = 0).
// REQUIRES: one share per cluster device, each >= 1 (else ConfigError). The global batch is the
// sum of the shares.
Plan fixedDataParallelPlan(const CostModel& model, const std::vector<int>& shares, int micro_batch,
                           PrecisionPolicy precision);

// One pipeline of S = cluster size stages, stage s on device s over layers [cuts[s], cuts[s+1]),
// `global_batch` samples in `micro_batches` micro-batches. REQUIRES: cuts start at 0, end at the
// layer count and increase strictly; micro_batches in [1, global_batch] (else ConfigError).
Plan fixedPipelinePlan(const CostModel& model, const std::vector<int>& cuts, int global_batch,
                       int micro_batches, Schedule schedule, PrecisionPolicy precision);

}  // namespace chorus::plan
