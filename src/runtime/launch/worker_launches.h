// How a node's agent starts its workers: each worker's command, environment and secret
// (describeWorkers), with the placement decisions behind them: the emulated CPU workers' turns
// within a step (device::staggerOffsets) and every worker's intra-op threads
// (device::intraOpThreads). Private to runtime's launch.
#pragma once

#include <string>
#include <vector>

#include "chorus/comm/store/job_secret.h"
#include "chorus/core/device_spec.h"
#include "chorus/runtime/launch/agent.h"
#include "chorus/runtime/launch/supervisor.h"
#include "launch/node_rendezvous.h"

namespace chorus::runtime {

// The workers of this node (one per device, ranks from `slot`), whose communicators meet at
// `store_endpoint`; logs the emulation offsets and thread counts it gives them.
std::vector<WorkerLaunch> describeWorkers(const AgentOptions& options,
                                          const std::vector<DeviceSpec>& devices, int cores,
                                          const NodeSlot& slot, const std::string& store_endpoint,
                                          const comm::JobSecret& secret);

}  // namespace chorus::runtime
