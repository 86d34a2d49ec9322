// What a data-parallel group carries over when its membership changes (elastic recovery): the
// lost ranks' samples handed to the survivors, a share for each worker that joins, and the load
// balancer's knowledge of the survivors kept. Pure functions of their arguments, so every member
// computes the same.
#pragma once

#include <cstdint>
#include <vector>

#include "chorus/plan/balancer.h"
#include "chorus/plan/plan.h"

namespace chorus::plan {

// The shares of the survivors `kept` (old rank indices into `shares`, ascending) after the other
// ranks are lost: the global batch (the sum of `shares`) split in proportion to their shares
// (largest remainder, ties to the lower rank), so ranks that the balancer had found faster take
// more of what the lost ones leave. A survivor whose share was 0 keeps 0 unless every survivor's
// was, when the batch is split evenly. Throws ConfigError for an empty or invalid `kept`.
std::vector<std::int64_t> survivorShares(const std::vector<std::int64_t>& shares,
                                         const std::vector<int>& kept);

// The shares of the survivors `kept` and of the workers that join them, in that order. A joiner
// counts as if its device ran now as it was planned at launch relative to the survivors:
// `joiner_planned[j]` (its slot's share in the launch plan) times the survivors' current shares
// over their planned ones (`kept_planned`, one per kept rank). The global batch is then split in
// proportion as survivorShares does; with no joiner the result is survivorShares'. When every
// lost worker is replaced and the balancer has not moved, the launch plan's shares come back.
// Throws ConfigError for an invalid `kept` or sizes that differ.
std::vector<std::int64_t> regroupShares(const std::vector<std::int64_t>& shares,
                                        const std::vector<int>& kept,
                                        const std::vector<std::int64_t>& kept_planned,
                                        const std::vector<std::int64_t>& joiner_planned);

// `state` restricted to the survivors `kept` (old rank indices, ascending), renumbered in that
// order, with `shares` (one per survivor) as the new shares: the survivors' speed observations,
// held observations and fixed costs stay, the lost ranks' go; a pending small move is dropped
// (it was a move among the old ranks), and the change history is kept. `shares` may hold more
// entries than `kept`: the ranks after the survivors are workers that join, with no observation
// (the balancer profiles them in from their first steps) and no remembered fixed cost.
BalancerState survivorBalancerState(const BalancerState& state, const std::vector<int>& kept,
                                    const std::vector<std::int64_t>& shares);

// The one-stage data-parallel plan of the next generation: the kept ranks' entries of `current`
// (old rank indices, ascending) and, after them, each joiner's launch rank's entry of `launch`
// (`joiner_slots`: the launch rank each joiner runs in place of), ranks renumbered in that order,
// each replica with its share of `shares` (one per kept rank, then one per joiner). A replica
// that ran its share in one pass still does (its micro-batch follows the share); a memory limit
// stays. ZeRO shards (Plan::zero_shards) keep their proportions: the kept ranks' fractions and
// the joiners' launch fractions, these scaled as the kept ones grew since launch (`kept_slots`:
// the kept ranks' launch ranks; without them unscaled), all scaled to sum to 1. Throws ConfigError
// for a plan of pipeline replicas, ranks out of range or sizes that differ.
Plan regroupPlan(const Plan& current, const std::vector<int>& kept, const Plan& launch,
                 const std::vector<int>& joiner_slots, const std::vector<std::int64_t>& shares,
                 const std::vector<int>& kept_slots = {});

// Appends to `launch` a device the launch plan did not have — a node that joined the running job
// brought it — as one more one-stage replica, and returns its slot (its rank index in `launch`),
// which regroupPlan and regroupShares then take like a launch rank's. Its planned share is the
// launch plan's mean share (rounded, at least 1): where the balancer starts a device it knows
// nothing of, before it profiles it in. It runs its share in one pass unless `micro_batch` (> 0)
// caps it. `launch` is then a record of every device that ever joined, not a plan to run (its
// shares sum past the global batch). Throws ConfigError for a plan of pipeline replicas or one
// with ZeRO (a new device's slice would have to be sized and restored: not built).
int addJoinedDevice(Plan& launch, RankPlan rank, std::int64_t micro_batch);

}  // namespace chorus::plan
