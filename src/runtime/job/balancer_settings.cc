#include "job/balancer_settings.h"

#include <cstdint>
#include <string>
#include <vector>

namespace chorus::runtime {

plan::BalancerOptions balancerOptions(const BalancerSection& section) {
  plan::BalancerOptions options;
  options.mode = plan::LoadBalancer::parseMode(section.mode);
  options.profile_steps = static_cast<int>(section.profile_steps);
  options.min_gain = section.min_gain;
  options.cooldown_steps = static_cast<int>(section.cooldown_steps);
  options.window = static_cast<int>(section.window);
  options.initial_shares = section.initial_shares;
  options.leave_out = section.leave_out;
  return options;
}

nlohmann::json balancerStateToJson(const plan::BalancerState& state) {
  return {{"shares", state.shares},
          {"steps_observed", state.steps_observed},
          {"last_change_step", state.last_change_step},
          {"static_done", state.static_done},
          {"observation_rank", state.observation_rank},
          {"observation_samples", state.observation_samples},
          {"observation_seconds", state.observation_seconds},
          {"held_rank", state.held_rank},
          {"held_samples", state.held_samples},
          {"held_seconds", state.held_seconds},
          {"held_ratio", state.held_ratio},
          {"fixed_seconds", state.fixed_seconds},
          {"last_change", state.last_change},
          {"small_gain_updates", state.small_gain_updates},
          {"small_gain_direction", state.small_gain_direction}};
}

plan::BalancerState balancerStateFromJson(const nlohmann::json& json) {
  plan::BalancerState state;
  state.shares = json.at("shares").get<std::vector<std::int64_t>>();
  state.steps_observed = json.at("steps_observed").get<std::int64_t>();
  state.last_change_step = json.at("last_change_step").get<std::int64_t>();
  state.static_done = json.at("static_done").get<bool>();
  state.observation_rank = json.at("observation_rank").get<std::vector<int>>();
  state.observation_samples = json.at("observation_samples").get<std::vector<std::int64_t>>();
  state.observation_seconds = json.at("observation_seconds").get<std::vector<double>>();
  // Absent in checkpoints written before the balancer held observations back (2026-12-01).
  state.held_rank = json.value("held_rank", std::vector<int>{});
  state.held_samples = json.value("held_samples", std::vector<std::int64_t>{});
  state.held_seconds = json.value("held_seconds", std::vector<double>{});
  state.held_ratio = json.value("held_ratio", std::vector<double>{});
  state.fixed_seconds = json.value("fixed_seconds", std::vector<double>{});
  state.last_change = json.at("last_change").get<std::string>();
  state.small_gain_updates = json.value("small_gain_updates", std::int64_t{0});
  state.small_gain_direction = json.value("small_gain_direction", std::vector<int>{});
  return state;
}

}  // namespace chorus::runtime
