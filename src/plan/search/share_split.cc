#include "search/share_split.h"

#include <algorithm>
#include <queue>

namespace chorus::plan::detail {
namespace {

// Largest b with cost[b - 1] <= limit (0 when even b = 1 costs more).
int capAt(const std::vector<double>& cost, double limit) {
  return static_cast<int>(std::upper_bound(cost.begin(), cost.end(), limit) - cost.begin());
}

long long capacityAt(const std::vector<std::vector<double>>& cost, const std::vector<int>& members,
                     double limit) {
  long long total = 0;
  for (size_t c = 0; c < cost.size(); ++c) {
    if (members[c] == 0) continue;
    const int cap = capAt(cost[c], limit);
    if (cap == 0) return -1;
    total += static_cast<long long>(cap) * members[c];
  }
  return total;
}

}  // namespace

std::optional<std::vector<int>> splitShares(const std::vector<std::vector<double>>& cost,
                                            const std::vector<int>& class_of, int total) {
  const int ranks = static_cast<int>(class_of.size());
  if (ranks == 0 || total < ranks) return std::nullopt;
  std::vector<int> members(cost.size(), 0);
  for (int c : class_of) ++members[c];
  std::vector<double> limits;
  for (size_t c = 0; c < cost.size(); ++c)
    if (members[c] > 0) limits.insert(limits.end(), cost[c].begin(), cost[c].end());
  std::sort(limits.begin(), limits.end());
  limits.erase(std::unique(limits.begin(), limits.end()), limits.end());
  // The smallest limit at which the ranks can hold the batch.
  size_t low = 0, high = limits.size();
  while (low < high) {
    const size_t mid = (low + high) / 2;
    if (capacityAt(cost, members, limits[mid]) >= total)
      high = mid;
    else
      low = mid + 1;
  }
  if (low == limits.size()) return std::nullopt;
  const double limit = limits[low];
  std::vector<int> shares(ranks);
  long long excess = -total;
  for (int i = 0; i < ranks; ++i) {
    shares[i] = capAt(cost[class_of[i]], limit);
    excess += shares[i];
  }
  // Give back the excess from the ranks whose current share costs most (ties: highest rank).
  using Item = std::pair<double, int>;
  std::priority_queue<Item> heap;
  for (int i = 0; i < ranks; ++i) heap.push({cost[class_of[i]][shares[i] - 1], i});
  while (excess > 0) {
    const int i = heap.top().second;
    heap.pop();
    if (shares[i] == 1) continue;
    --shares[i];
    --excess;
    heap.push({cost[class_of[i]][shares[i] - 1], i});
  }
  return shares;
}

}  // namespace chorus::plan::detail
