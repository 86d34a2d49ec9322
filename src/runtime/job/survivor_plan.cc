// The plan an elastic pipeline job's survivors go on with: the job's own planning (planOfJob) on
// the devices left, with as many stages as keeps every device busy.
#include "chorus/runtime/job/survivor_plan.h"

#include <algorithm>
#include <cstdlib>

#include "chorus/core/error.h"
#include "chorus/runtime/job/job_plan.h"
#include "chorus/runtime/job/pipeline_job.h"

namespace chorus::runtime {
namespace {

bool listsLayerCounts(const std::string& partition) {
  return partition != "auto" && partition != "even";
}

}  // namespace

int survivorStages(int devices, int stages, int layers) {
  CHORUS_CHECK_CONFIG(devices >= 1 && stages >= 1 && layers >= 1, "elastic: ", devices,
                      " devices, ", stages, " stages and ", layers, " layers do not make a plan");
  int best = 1;
  for (int candidate = 2; candidate <= std::min(devices, layers); ++candidate) {
    if (devices % candidate != 0) continue;
    if (best == 1 || std::abs(candidate - stages) <= std::abs(best - stages)) best = candidate;
  }
  return best;
}

plan::Plan survivorPipelinePlan(const JobConfig& job, const plan::Plan& launch,
                                const std::vector<plan::RankPlan>& ranks, int layers) {
  CHORUS_CHECK_CONFIG(!ranks.empty(), "elastic: a plan for no devices");
  const int devices = static_cast<int>(ranks.size());
  const int stages = survivorStages(devices, launch.stageCount(), layers);
  // The launch plan's schedule, micro-batches and checkpointing (a plan file's or the planner's,
  // which the job's [parallel] does not repeat), cut anew by the job's planning.
  JobConfig next = job;
  next.parallel.pipeline_stages = stages;
  next.parallel.replicas = stages > 1 ? devices / stages : 1;
  next.parallel.micro_batches = launch.micro_batches;
  next.parallel.schedule = plan::toString(launch.schedule);
  next.parallel.activation_checkpointing = plan::toString(plannedCheckpointing(
      launch, plan::parseCheckpointing(job.parallel.activation_checkpointing)));
  if (listsLayerCounts(next.parallel.partition)) next.parallel.partition = "auto";
  const std::size_t replicas = stages > 1 ? next.parallel.replicas : devices;
  if (next.balancer.shares.size() != replicas) next.balancer.shares.clear();
  if (next.balancer.initial_shares.size() != replicas) next.balancer.initial_shares.clear();
  std::vector<DeviceSpec> specs;
  std::vector<std::string> nodes;
  for (const plan::RankPlan& rank : ranks) {
    specs.push_back(plan::jobDevice(rank));
    nodes.push_back(rank.node);
  }
  plan::Plan plan = planOfJob(next, specs, nodes);
  // precision.ranks names launch ranks: each device keeps the format it was launched with.
  for (std::size_t r = 0; r < ranks.size(); ++r) plan.ranks[r].precision = ranks[r].precision;
  plan.reason = "the survivors of an elastic pipeline job, re-cut over " + std::to_string(devices) +
                " devices";
  return plan;
}

}  // namespace chorus::runtime
