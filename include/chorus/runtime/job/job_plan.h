// The Plan a `chorus train` job runs (docs/architecture.md, "The plan"): built once by the front
// end, checked against the job and its devices, and handed to every worker with the job
// (job_package.h), so that no worker plans, cuts or splits on its own.
//
// Where it comes from: the job's [parallel] and balancer keys as written (plan = "manual",
// planOfJob), or a plan made elsewhere and adopted as it is (adoptPlan): the planner's (plan =
// "auto", planJob) or a plan file's (`chorus train --plan FILE`). An executed plan is *in rank
// order*: rank r runs replica r / S, stage r % S (S stages per replica), and ranks[r].device = r
// indexes the job's devices in that order.
//
// How the trainers read it: the start shares (the balancer, unless `balance = off` or
// balancer.shares fixes them, moves them from there), each rank's compute precision, a
// data-parallel rank's micro-batch (a micro_batch equal to the global batch means "the whole
// share in one pass"), and a pipeline's cut, micro-batches, schedule and checkpointing.
#pragma once

#include <string>
#include <vector>

#include "chorus/core/device_spec.h"
#include "chorus/plan/plan.h"
#include "chorus/runtime/job/job_config.h"

namespace chorus::runtime {

// The plan of `job` as written on `devices` (the job's devices in rank order), nodes[r] the node
// of rank r (default: every rank on "node0"). Data parallelism: one replica per rank with the
// balancer's start shares: balancer.shares, initial_shares, the equal split under `balance =
// "off"`, else in proportion to startSpeeds(devices, rates) with at least one sample each.
// `rates[r]`: the measured throughput of rank r's physical device (measureStartRates), in any
// unit; empty: all alike, so only emulated speeds tell devices apart. Pipelines: the [parallel]
// layout, its cut by device speed and memory (parallel::stageCuts) and the replicas' start shares
// by their slowest stage. Throws ConfigError (what validatePipelineJob and validateJobOnDevices
// refuse).
plan::Plan planOfJob(const JobConfig& job, const std::vector<DeviceSpec>& devices,
                     const std::vector<std::string>& nodes = {},
                     const std::vector<double>& rates = {});

// Each device's expected speed: rates[r] (1 when empty) times its emulated speed (`cpu@0.5`).
// Throws ConfigError on rates of the wrong count, or not finite and positive.
std::vector<double> startSpeeds(const std::vector<DeviceSpec>& devices,
                                const std::vector<double>& rates);

// `plan` renumbered into rank order (see above): replica r's stage s becomes rank r·S + s.
plan::Plan inRankOrder(const plan::Plan& plan);

// The devices of `plan`'s ranks, rank order: rank r runs devices[plan.ranks[r].device].
// Throws ConfigError naming both when a rank's device is missing or is not the device type the
// plan names (a plan made for other devices).
std::vector<DeviceSpec> devicesOfPlan(const plan::Plan& plan,
                                      const std::vector<DeviceSpec>& devices);

// Checks an executed plan (rank order) against the job it runs and the devices of its ranks:
// the structure (Plan::validate against the model's layers), the global batch, one rank per
// device whose spec is the plan's device type (emulated speed and budget are part of the spec,
// as in a local cluster file, so a rank's own emulated_speed and memory_budget must be 1 and 0),
// the job's [comm] as the plan's CommPlan (the job under the plan), ZeRO only without stages.
// Throws ConfigError naming both.
void checkPlanForJob(const plan::Plan& plan, const JobConfig& job,
                     const std::vector<DeviceSpec>& devices);

// The job as `plan` runs it: ZeRO's stage and the gradient synchronization ([comm]'s algorithm,
// codec and knobs, buckets, sync_every) are the plan's where the job leaves the keys unset
// (ZeroSection::stage_given, CommSection::given), and the job is checked again with them. The
// engines read them from the plan; this keeps the job's own checks, ZeRO's shard sizing
// (zeroShardFractions) and the plans of elastic survivors (planOfJob) in step with it. Throws
// ConfigError naming the key when the job sets another value than the plan runs.
JobConfig jobUnderPlan(JobConfig job, const plan::Plan& plan);

// A plan made elsewhere (the planner's under plan = "auto", a plan file's) adopted as it is for
// `job` on one node's devices `listed`. Value type.
struct AdoptedPlan {
  plan::Plan plan;                  // in rank order, ranks[r].device = r
  JobConfig job;                    // jobUnderPlan(job, plan)
  std::vector<DeviceSpec> devices;  // rank r's device; a plan may leave some of `listed` out
};

// `plan` in rank order (inRankOrder), each rank on the listed device it names (devicesOfPlan),
// the job under it (jobUnderPlan), the three checked together (checkPlanForJob). Throws
// ConfigError as those do.
AdoptedPlan adoptPlan(const plan::Plan& plan, const JobConfig& job,
                      const std::vector<DeviceSpec>& listed);

// One line for the log: "data parallel on cpu@1.0, cpu@0.5: shares 43/21, fp32/fp32" or
// "2 pipelines x 2 stages on ...: layers 3/5, 8 micro-batches 1f1b, replica shares 40/24".
std::string describePlan(const plan::Plan& plan);

// The format a plan rank computes in: its precision, fp32 for tf32 (TF32 is the job's matmul
// mode, precision.tf32, not a format of its own to the trainers).
plan::Dtype computePrecision(const plan::RankPlan& rank);

// computePrecision's name ("fp32", "bf16", "fp16").
std::string precisionName(const plan::RankPlan& rank);

}  // namespace chorus::runtime
