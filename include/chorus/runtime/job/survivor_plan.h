// The plan an elastic pipeline job's survivors go on with (docs/elastic.md, "Pipelines"): as
// many stages as keeps every device busy, cut over the devices left by the job's own planning.
#pragma once

#include <vector>

#include "chorus/plan/plan.h"
#include "chorus/runtime/job/job_config.h"

namespace chorus::runtime {

// Elastic recovery of a pipeline job (docs/elastic.md): the stages per replica of the next
// generation on `devices` devices, for a job launched with `stages` stages of a model of `layers`
// layers — the divisor of `devices` in [2, layers] nearest to `stages` (a tie to more stages, so
// that no device holds more layers than it must), so that every device has a stage; 1 (one-stage
// data parallelism) for a lone device or where no such divisor exists. Pure.
int survivorStages(int devices, int stages, int layers);

// The plan of an elastic pipeline job's next generation on `ranks`, the entries of `launch` (the
// plan the job started with) of the devices that go on, in their new rank order, for the job's
// model of `layers` layers: survivorStages stages per replica (launch's stage count wanted) and as
// many replicas as the devices make, with launch's schedule, micro-batches and checkpointing, cut
// over their speeds and memory as at launch (a partition that lists layer counts becomes "auto"),
// each replica's share by its slowest stage (balancer.shares kept only where they still are one
// per replica), every rank computing in its launch precision. Pure; every rank computes the same.
// Throws ConfigError when no cut fits the devices' memory.
plan::Plan survivorPipelinePlan(const JobConfig& job, const plan::Plan& launch,
                                const std::vector<plan::RankPlan>& ranks, int layers);

}  // namespace chorus::runtime
