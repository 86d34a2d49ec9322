// The load balancer as both trainers (data-parallel and pipeline) set it up and checkpoint it:
// its options from the job's [balancer] section, and its state in a checkpoint's trainer.json,
// one schema, so that both resume a balancer exactly.
#pragma once

#include <nlohmann/json.hpp>

#include "chorus/plan/balancer.h"
#include "chorus/runtime/job/job_config.h"

namespace chorus::runtime {

// plan::LoadBalancer's options from the job's `balance` mode and [balancer] keys, initial_shares
// included. Throws ConfigError on an unknown mode.
plan::BalancerOptions balancerOptions(const BalancerSection& section);

nlohmann::json balancerStateToJson(const plan::BalancerState& state);
// Throws nlohmann::json::exception on a missing or mistyped field; fields added later
// (the held observations, the fixed costs) may be absent, and are then empty.
plan::BalancerState balancerStateFromJson(const nlohmann::json& json);

}  // namespace chorus::runtime
