// Private to runtime: load balancing across the replicas of a pipeline job (R data-parallel
// pipelines of S stages), with the data-parallel trainer's policy, plan::LoadBalancer.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chorus/plan/balancer.h"
#include "chorus/runtime/job/job_config.h"

namespace chorus::runtime {

// How many samples of each global batch every replica of a pipeline job takes, following the
// replicas' measured step times through a plan::LoadBalancer.
//
// A replica needs at least one sample per micro-batch (the engine's rule), a floor LoadBalancer
// has no notion of (it knows caps only). So the balancer splits only the samples above the
// floors: share_r = floor + b_r, Σ b_r = B − R·floor. A replica's time at floor + b samples is
// (a + c·floor) + c·b, still a line a' + c·b in the balanced b, which is what the balancer fits;
// balancing the excess is balancing the shares. One approximation: the balancer prices b_r = 0 at
// nothing, whereas a replica at its floor still costs a + c·floor; it matters only for a replica
// so slow that the balancer empties it, which then stays at its floor as it should.
//
// Starts at the planned shares (the devices' specs); mode "off" keeps them, "static" and
// "adaptive" refine them exactly as they do for data parallelism. With one replica, or a batch
// with nothing above the floors, there is nothing to balance and the shares never change.
//
// Every rank owns an identical instance and feeds it the same all-gathered figures, so all ranks
// change shares at the same step. Not thread-safe; non-copyable.
class ReplicaBalancer {
 public:
  // `start`: one share per replica, each >= `floor` (>= 1), summing to the global batch.
  // `caps`: the most samples a replica may take (pipelineShareCaps; 0 or empty: no limit). A cap
  // below a replica's start share is raised to it: the balancer does not take back what the plan
  // gave. `options.initial_shares` is ignored (the balancer starts at `start`). Throws
  // ConfigError on invalid options, start shares or caps.
  ReplicaBalancer(plan::BalancerOptions options, std::vector<std::int64_t> start,
                  std::int64_t floor, std::vector<std::int64_t> caps = {});
  ReplicaBalancer(const ReplicaBalancer&) = delete;
  ReplicaBalancer& operator=(const ReplicaBalancer&) = delete;

  // Samples per replica for the coming step; Σ = the global batch, each >= the floor.
  const std::vector<std::int64_t>& shares() const { return shares_; }
  std::int64_t floor() const { return floor_; }
  // Whether shares can ever change (more than one replica, something above the floors, mode not
  // "off").
  bool active() const;

  // Feeds every replica's seconds for `step` (run at shares()). Returns true when shares()
  // changed; lastChange() then says why. Throws ConfigError on a wrong number of figures.
  bool update(std::int64_t step, const std::vector<double>& replica_seconds);
  // One log line about the latest change, e.g. "step 5: replica shares 16,16 -> 25,7 (4 per
  // replica for its micro-batches, the rest balanced: shares 12,12 -> 21,3: predicted ...)".
  // Empty before the first change.
  const std::string& lastChange() const { return last_change_; }

  // The state for a checkpoint: the floor, the shares and the balancer's plan::BalancerState.
  nlohmann::json toJson() const;
  // Restores a state written by toJson() for the same number of replicas and global batch. A
  // state of another floor (parallel.micro_batches changed) keeps its shares, when they still
  // hold the new floor, and starts the balancer's measurements anew. Throws CheckpointError when
  // the state does not fit.
  void restore(const nlohmann::json& saved);

 private:
  void startBalancer(const std::vector<std::int64_t>& shares);

  plan::BalancerOptions options_;
  std::int64_t floor_;
  std::int64_t global_batch_;
  std::vector<std::int64_t> shares_;
  std::vector<std::int64_t> caps_;
  // Null when there is nothing to balance (one replica, or no sample above the floors).
  std::unique_ptr<plan::LoadBalancer> balancer_;
  std::string last_change_;
};

}  // namespace chorus::runtime
