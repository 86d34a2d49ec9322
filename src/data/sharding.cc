#include "chorus/data/sharding.h"

#include <algorithm>

#include "chorus/core/error.h"

namespace chorus::data {

std::vector<std::int64_t> shardOf(const std::vector<std::int64_t>& global_ids,
                                  const std::vector<std::int64_t>& shares, int rank) {
  CHORUS_CHECK_CONFIG(rank >= 0 && static_cast<size_t>(rank) < shares.size(), "rank ", rank,
                      " has no share: there are ", shares.size(), " shares");
  std::int64_t total = 0;
  std::int64_t begin = 0;
  for (size_t r = 0; r < shares.size(); ++r) {
    CHORUS_CHECK_CONFIG(shares[r] >= 0, "the share of rank ", r, " is negative (", shares[r], ")");
    if (static_cast<int>(r) == rank) begin = total;
    total += shares[r];
  }
  CHORUS_CHECK_CONFIG(total == static_cast<std::int64_t>(global_ids.size()), "the shares sum to ",
                      total, " but the global batch has ", global_ids.size(), " samples");
  return std::vector<std::int64_t>(global_ids.begin() + begin,
                                   global_ids.begin() + begin + shares[rank]);
}

std::vector<std::vector<std::int64_t>> microBatches(const std::vector<std::int64_t>& ids,
                                                    std::int64_t max_micro_batch) {
  CHORUS_CHECK_CONFIG(max_micro_batch >= 1, "the micro-batch size must be at least 1, got ",
                      max_micro_batch);
  std::vector<std::vector<std::int64_t>> chunks;
  const auto limit = static_cast<size_t>(max_micro_batch);
  for (size_t begin = 0; begin < ids.size(); begin += limit) {
    const size_t end = std::min(ids.size(), begin + limit);
    chunks.emplace_back(ids.begin() + begin, ids.begin() + end);
  }
  return chunks;
}

}  // namespace chorus::data
