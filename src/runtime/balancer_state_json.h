// A load balancer's state in a checkpoint's trainer.json: one schema for the data-parallel and
// the pipeline trainer, so that both resume a balancer exactly.
#pragma once

#include <nlohmann/json.hpp>

#include "chorus/plan/balancer.h"

namespace chorus::runtime {

nlohmann::json balancerStateToJson(const plan::BalancerState& state);
// Throws nlohmann::json::exception on a missing or mistyped field; fields added later
// (the held observations, the fixed costs) may be absent, and are then empty.
plan::BalancerState balancerStateFromJson(const nlohmann::json& json);

}  // namespace chorus::runtime
