// What a data-parallel group carries over when some of its ranks are lost (elastic recovery):
// the lost ranks' samples handed to the survivors, and the load balancer's knowledge of the
// survivors kept. Pure functions of their arguments, so every survivor computes the same.
#pragma once

#include <cstdint>
#include <vector>

#include "chorus/plan/balancer.h"

namespace chorus::plan {

// The shares of the survivors `kept` (old rank indices into `shares`, ascending) after the other
// ranks are lost: the global batch (the sum of `shares`) split in proportion to their shares
// (largest remainder, ties to the lower rank), so ranks that the balancer had found faster take
// more of what the lost ones leave. A survivor whose share was 0 keeps 0 unless every survivor's
// was, when the batch is split evenly. Throws ConfigError for an empty or invalid `kept`.
std::vector<std::int64_t> survivorShares(const std::vector<std::int64_t>& shares,
                                         const std::vector<int>& kept);

// `state` restricted to the survivors `kept` (old rank indices, ascending), renumbered in that
// order, with `shares` (one per survivor) as the new shares: the survivors' speed observations,
// held observations and fixed costs stay, the lost ranks' go; a pending small move is dropped
// (it was a move among the old ranks), and the change history is kept.
BalancerState survivorBalancerState(const BalancerState& state, const std::vector<int>& kept,
                                    const std::vector<std::int64_t>& shares);

}  // namespace chorus::plan
