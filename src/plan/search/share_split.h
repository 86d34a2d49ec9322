// Min-max integer shares for heterogeneous data parallelism under the planner's cost model.
//
// Unlike balancer.h (the runtime's online balancer, which fits t(b) = a + c*b to measurements),
// the planner's per-rank time is a step function of b (accumulation in micro-batches that fit
// memory, a roofline, the overlap of the last backward with synchronization). It is nondecreasing
// in b, which is all this split needs to be exact.
#pragma once

#include <optional>
#include <vector>

namespace chorus::plan::detail {

// Integer shares b_i >= 1 with sum = total that minimize max_i cost[class_of[i]][b_i - 1].
// cost[c] lists class c's cost for b = 1, 2, ...; it must be nondecreasing, and shares are
// capped at its length. Ties: any optimal split, chosen deterministically. nullopt when the
// classes cannot take `total` (too few ranks or too short cost lists).
std::optional<std::vector<int>> splitShares(const std::vector<std::vector<double>>& cost,
                                            const std::vector<int>& class_of, int total);

}  // namespace chorus::plan::detail
