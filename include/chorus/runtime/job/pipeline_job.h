// A pipeline job's plan as the executor (trainer.h) runs it: the engine's options from the
// config, each stage's device, the replicas' start shares and their memory caps, and the checks
// `chorus train` runs before any worker starts. Pure functions; every rank computes the same.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chorus/core/device_spec.h"
#include "chorus/parallel/pipeline_layout.h"
#include "chorus/plan/memory_model.h"
#include "chorus/plan/plan.h"
#include "chorus/runtime/job/job_config.h"

namespace chorus::runtime {

// The engine's options for `job` ([parallel] and train.global_batch; replica_shares left empty).
// Throws ConfigError on a bad schedule or checkpointing name.
parallel::PipelineOptions pipelineOptions(const JobConfig& job);

// The checkpointing a pipeline `plan` runs with, the job's mode being `job_mode`: none when the
// plan does not checkpoint; else the job's mode, or keeping layer outputs (the planner's meaning)
// when the job names none.
parallel::Checkpointing plannedCheckpointing(const plan::Plan& plan,
                                             parallel::Checkpointing job_mode);

// The devices of a pipeline job's ranks (rank = replica · S + stage) as the cut sees them,
// [replica][stage]: speed and memory budget (0: none). Throws ConfigError on a count that does not
// fit the layout.
std::vector<std::vector<parallel::StageDevice>> stageDevices(
    const parallel::PipelineLayout& layout, const std::vector<DeviceSpec>& devices);

// Each replica's share of the global batch: proportional to 1 / max over its stages of (the
// stage's seconds per sample under `cuts`, as the cut's cost model prices it at the micro-batch
// of an equal split: parallel::stageSeconds) / (its device's speed), each at least
// micro_batches.
// `devices[replica][stage]`. Pure; every rank computes the same.
std::vector<std::int64_t> pipelineReplicaShares(
    const parallel::PipelineOptions& options, const std::vector<model::LayerProfile>& profile,
    const std::vector<int>& cuts, const std::vector<std::vector<parallel::StageDevice>>& devices);

// The most samples each replica may take per step under its devices' memory budgets: the largest
// share whose micro-batches (ceil(share / micro_batches) samples) every stage of the replica holds
// within its budget by the job's memory model (memoryModelForBudgets), the model the cut is
// checked with. 0 for a replica without budgets (no limit; `memory` may then be null). The load
// balancer never moves a share above it. Pure.
std::vector<std::int64_t> pipelineShareCaps(
    const parallel::PipelineOptions& options,
    const std::shared_ptr<const plan::MemoryModel>& memory, const std::vector<int>& cuts,
    const std::vector<std::vector<parallel::StageDevice>>& devices);

// Throws ConfigError "config key 'parallel.recut': ..." when the job's adaptive cut cannot apply
// on `devices` (rank order): memory budgets with more than one replica and an active balancer
// (the balancer's share caps are the start cut's; a moved cut could need lower ones).
void checkRecut(const JobConfig& job, const std::vector<DeviceSpec>& devices);

// Checks a pipeline job against the devices it will run on (rank k on devices[k]), before any
// worker starts: the device count, the data files and the global batch (as validateJobOnDevices,
// without its whole-model memory check), the partition against the model's layers, that a cut
// fits every memory budget, and checkRecut. Throws ConfigError.
void validatePipelineJob(const JobConfig& job, const std::vector<DeviceSpec>& devices);

}  // namespace chorus::runtime
