// The Plan of a job whose ranks started without one (torchrun, mpirun, srun, or a program that
// builds its own trainer): every rank all-gathers its device and host and plans the same way.
#pragma once

#include "chorus/plan/plan.h"
#include "chorus/runtime/job/job_config.h"
#include "chorus/runtime/launch/worker.h"

namespace chorus::runtime {

// planOfJob (job_plan.h) on every rank's device and node, all-gathered from the world
// communicator of `worker`; collective. Nodes are numbered in the order of their first rank.
plan::Plan planOfWorld(const JobConfig& job, Worker& worker);

}  // namespace chorus::runtime
