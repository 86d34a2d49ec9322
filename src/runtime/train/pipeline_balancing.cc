#include "train/pipeline_balancing.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "chorus/core/error.h"
#include "job/balancer_settings.h"

namespace chorus::runtime {
namespace {

std::string joined(const std::vector<std::int64_t>& values) {
  std::ostringstream text;
  for (size_t i = 0; i < values.size(); ++i) text << (i ? "," : "") << values[i];
  return text.str();
}

}  // namespace

ReplicaBalancer::ReplicaBalancer(plan::BalancerOptions options, std::vector<std::int64_t> start,
                                 std::int64_t floor, std::vector<std::int64_t> caps)
    : options_(std::move(options)),
      floor_(floor),
      global_batch_(std::accumulate(start.begin(), start.end(), std::int64_t{0})),
      shares_(std::move(start)),
      caps_(std::move(caps)) {
  CHORUS_CHECK_CONFIG(!shares_.empty(), "replica balancer: no replicas");
  CHORUS_CHECK_CONFIG(caps_.empty() || caps_.size() == shares_.size(),
                      "replica balancer: ", caps_.size(), " caps for ", shares_.size(),
                      " replicas");
  CHORUS_CHECK_CONFIG(floor_ >= 1, "replica balancer: a floor of ", floor_, " samples");
  for (std::int64_t share : shares_)
    CHORUS_CHECK_CONFIG(share >= floor_, "replica balancer: start shares ", joined(shares_),
                        " below the floor of ", floor_, " samples per replica");
  options_.initial_shares.clear();
  startBalancer(shares_);
}

void ReplicaBalancer::startBalancer(const std::vector<std::int64_t>& shares) {
  balancer_.reset();
  const auto replicas = static_cast<std::int64_t>(shares.size());
  const std::int64_t excess = global_batch_ - replicas * floor_;
  // LoadBalancer needs a batch of at least one sample; one replica has nothing to balance.
  if (replicas < 2 || excess < 1) return;
  plan::BalancerOptions options = options_;
  // The balancer splits the excess over the floor: a replica at zero excess still runs its
  // micro-batches, so nothing is left out and no log line should say so.
  options.leave_out = false;
  std::vector<std::int64_t> caps;  // of the excess; LoadBalancer reads 0 as "no cap"
  for (size_t r = 0; r < shares.size(); ++r) {
    options.initial_shares.push_back(shares[r] - floor_);
    const std::int64_t cap = caps_.empty() ? 0 : caps_[r];
    // A cap at the floor would read as none: one sample above it is the tightest expressible
    // (the memory estimate behind the caps errs on the safe side).
    caps.push_back(cap > 0 ? std::max({cap - floor_, shares[r] - floor_, std::int64_t{1}}) : 0);
  }
  balancer_ =
      std::make_unique<plan::LoadBalancer>(options, static_cast<int>(replicas), excess, caps);
}

bool ReplicaBalancer::active() const {
  return balancer_ != nullptr && options_.mode != plan::BalancerMode::kOff;
}

bool ReplicaBalancer::update(std::int64_t step, const std::vector<double>& replica_seconds) {
  CHORUS_CHECK_CONFIG(replica_seconds.size() == shares_.size(),
                      "replica balancer: ", replica_seconds.size(), " figures for ", shares_.size(),
                      " replicas");
  if (!balancer_ || !balancer_->update(step, replica_seconds)) return false;
  const std::vector<std::int64_t> before = shares_;
  for (size_t r = 0; r < shares_.size(); ++r) shares_[r] = floor_ + balancer_->shares()[r];
  // The balancer's own line ("step 5: shares 12,12 -> 21,3: predicted ..."), without its step.
  std::string inner = balancer_->lastChange();
  if (inner.rfind("step ", 0) == 0 && inner.find(": ") != std::string::npos)
    inner = inner.substr(inner.find(": ") + 2);
  std::ostringstream line;
  line << "step " << step << ": replica shares " << joined(before) << " -> " << joined(shares_)
       << " (" << floor_ << " per replica for its micro-batches, the rest balanced: " << inner
       << ")";
  last_change_ = line.str();
  return true;
}

nlohmann::json ReplicaBalancer::toJson() const {
  return {
      {"floor", floor_},
      {"shares", shares_},
      {"last_change", last_change_},
      {"balancer", balancer_ ? balancerStateToJson(balancer_->exportState()) : nlohmann::json()}};
}

void ReplicaBalancer::restore(const nlohmann::json& saved) {
  const auto fail = [](const std::string& why) {
    CHORUS_THROW(CheckpointError, "replica balancer state does not fit this job: ", why);
  };
  std::vector<std::int64_t> shares;
  std::int64_t floor = 0;
  try {
    shares = saved.at("shares").get<std::vector<std::int64_t>>();
    floor = saved.at("floor").get<std::int64_t>();
  } catch (const nlohmann::json::exception& error) {
    fail(error.what());
  }
  if (shares.size() != shares_.size())
    fail(std::to_string(shares.size()) + " shares for " + std::to_string(shares_.size()) +
         " replicas");
  if (std::accumulate(shares.begin(), shares.end(), std::int64_t{0}) != global_batch_)
    fail("shares " + joined(shares) + " do not sum to the global batch " +
         std::to_string(global_batch_));
  for (std::int64_t share : shares)
    if (share < floor_)
      fail("shares " + joined(shares) + " below " + std::to_string(floor_) +
           " samples per replica (parallel.micro_batches)");
  shares_ = shares;
  last_change_ = saved.value("last_change", std::string());
  // Caps around the saved shares, which may exceed the start plan's.
  startBalancer(shares_);
  // Another floor: the saved measurements were of other excess shares; the balancer starts anew.
  if (floor != floor_ || saved.value("balancer", nlohmann::json()).is_null()) return;
  if (!balancer_) fail("a balancer's state where this job has nothing to balance");
  try {
    balancer_->importState(balancerStateFromJson(saved.at("balancer")));
  } catch (const nlohmann::json::exception& error) {
    fail(error.what());
  }
  for (size_t r = 0; r < shares_.size(); ++r) shares_[r] = floor_ + balancer_->shares()[r];
}

}  // namespace chorus::runtime
