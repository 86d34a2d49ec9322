// Uneven sharding: how one global batch is divided among ranks of unequal speed and memory.
//
// The plan (or the load balancer) gives rank r a share b_r of the global batch, with Σ b_r = B and
// any b_r allowed to be 0. Rank r takes the contiguous slice [Σ_{i<r} b_i, Σ_{i<=r} b_i) of the
// sampler's ids, so the concatenation of all shards in rank order is the global batch itself; a
// rank then processes its shard in micro-batches that fit its memory. Gradients are summed per
// sample and divided by B, so how the batch is cut never changes the result (invariant 1).
// Torch-free.
#pragma once

#include <cstdint>
#include <vector>

namespace chorus::data {

// Rank `rank`'s contiguous slice of `global_ids` under `shares` (one per rank). Throws ConfigError
// when a share is negative, the shares do not sum to global_ids.size(), or rank is not in
// [0, shares.size()).
std::vector<std::int64_t> shardOf(const std::vector<std::int64_t>& global_ids,
                                  const std::vector<std::int64_t>& shares, int rank);

// Splits `ids` into consecutive chunks of max_micro_batch ids, the last one possibly shorter; an
// empty list gives no chunks. Throws ConfigError when max_micro_batch < 1.
std::vector<std::vector<std::int64_t>> microBatches(const std::vector<std::int64_t>& ids,
                                                    std::int64_t max_micro_batch);

}  // namespace chorus::data
