// ZeRO shards sized by memory for a job whose ranks each keep a replica of their successor's
// slice (zero.redundancy = 1, docs/zero.md): rank r holds f[r] of the sharded state and a replica
// of f[r + 1 mod n], each as large, so the fractions are chosen together. Pure.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "chorus/plan/memory_model.h"

namespace chorus::plan {

// Fractions f (summing to 1) with every rank r within `headroom[r]` scaled by the smallest common
// factor λ: sharded · f[r] + replica[r] · f[r + 1 mod n] ≤ λ · headroom[r]. Found as the largest
// Σ x of the same constraints at λ = 1 (a small linear program, solved by the simplex method from
// the all-slack basis, which the positive headroom makes feasible), scaled to sum to 1; so λ =
// 1 / Σ x, and every rank fits when λ ≤ 1. Of the splits that reach λ, the one returned is the
// furthest towards the proportional split from the program's vertex (equal devices split
// evenly); without replicas it is the proportional split.
// REQUIRES: headroom[r] > 0, sharded > 0, replica[r] ≥ 0. Returns the fractions and λ.
std::pair<std::vector<double>, double> shardsAroundReplicas(const std::vector<double>& headroom,
                                                            double sharded,
                                                            const std::vector<double>& replica);

// Rank r's fraction of the sharded state (StageMemoryRequest's zero_stage decides what is
// sharded) such that the largest share of its headroom any rank uses — what usable[r] bytes
// leave after the rest of requests[r], against its slice plus its replica of rank r + 1's — is
// as small as it can be (shardsAroundReplicas). Without a replica it is
// zeroShardsByMemory's proportional split. Throws ConfigError naming the rank (by names[r]) that
// cannot hold even its replicated part, or saying how far the best split is from fitting.
std::vector<double> zeroShardsWithReplicas(const MemoryModel& memory,
                                           std::vector<StageMemoryRequest> requests,
                                           const std::vector<double>& usable,
                                           const std::vector<std::string>& names);

}  // namespace chorus::plan
