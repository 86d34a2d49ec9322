// Private to runtime: the plan entry of a device that joins a running elastic job on a node that
// was not there at launch (`chorus run --join`, WorkerIdentity::new_device). The joiner describes
// its device in the job's store before it asks to join; the member that hands the state over
// reads it and appends it to the launch plan (plan::addJoinedDevice), so that every member plans
// it alike from then on.
#pragma once

#include "chorus/comm/store/store.h"
#include "chorus/plan/plan.h"
#include "chorus/runtime/job/job_config.h"
#include "chorus/runtime/launch/worker.h"

namespace chorus::runtime {

// Refuses (ConfigError) a new device that the job cannot plan: a job that is not elastic, a plan
// of pipelines or with ZeRO, per-rank precisions (precision.ranks names launch ranks only).
void checkNewDeviceJoin(const JobConfig& job, const plan::Plan& launch, const Worker& worker);

// The joiner's side: writes its plan entry (device, node, precision as the job gives its kind) to
// the job's store under its member id.
void postJoinedDevice(const JobConfig& job, Worker& worker);

// The source's side: the entry `member` posted. Throws CommError when it posted none (it must
// have, before asking to join).
plan::RankPlan joinedDeviceOf(comm::Store& store, int member);

}  // namespace chorus::runtime
