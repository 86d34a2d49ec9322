#include "chorus/plan/survivors.h"

#include <algorithm>
#include <numeric>

#include "chorus/core/error.h"

namespace chorus::plan {
namespace {

void checkKept(const std::vector<int>& kept, std::size_t ranks) {
  CHORUS_CHECK_CONFIG(!kept.empty(), "survivors: no rank is kept");
  for (std::size_t i = 0; i < kept.size(); ++i) {
    CHORUS_CHECK_CONFIG(kept[i] >= 0 && static_cast<std::size_t>(kept[i]) < ranks,
                        "survivors: rank ", kept[i], " is not one of ", ranks);
    CHORUS_CHECK_CONFIG(i == 0 || kept[i - 1] < kept[i], "survivors: ranks must be ascending");
  }
}

// Old rank -> new rank, -1 for a lost one.
std::vector<int> renumbering(const std::vector<int>& kept, std::size_t ranks) {
  std::vector<int> index(ranks, -1);
  for (std::size_t i = 0; i < kept.size(); ++i) index[kept[i]] = static_cast<int>(i);
  return index;
}

}  // namespace

std::vector<std::int64_t> survivorShares(const std::vector<std::int64_t>& shares,
                                         const std::vector<int>& kept) {
  checkKept(kept, shares.size());
  const std::int64_t batch = std::accumulate(shares.begin(), shares.end(), std::int64_t{0});
  std::vector<double> weight;
  for (int rank : kept) weight.push_back(static_cast<double>(shares[rank]));
  double total = std::accumulate(weight.begin(), weight.end(), 0.0);
  if (total <= 0) {
    std::fill(weight.begin(), weight.end(), 1.0);
    total = static_cast<double>(weight.size());
  }
  std::vector<std::int64_t> result(kept.size());
  std::vector<std::pair<double, std::size_t>> remainders;
  std::int64_t given = 0;
  for (std::size_t i = 0; i < kept.size(); ++i) {
    const double exact = static_cast<double>(batch) * weight[i] / total;
    result[i] = static_cast<std::int64_t>(exact);
    given += result[i];
    remainders.push_back({exact - static_cast<double>(result[i]), i});
  }
  // Largest remainder first; equal remainders to the lower rank (stable order).
  std::stable_sort(remainders.begin(), remainders.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (std::size_t k = 0; given < batch; ++k, ++given) ++result[remainders[k % kept.size()].second];
  return result;
}

BalancerState survivorBalancerState(const BalancerState& state, const std::vector<int>& kept,
                                    const std::vector<std::int64_t>& shares) {
  checkKept(kept, state.shares.size());
  CHORUS_CHECK_CONFIG(shares.size() == kept.size(), "survivors: ", shares.size(), " shares for ",
                      kept.size(), " survivors");
  const std::vector<int> index = renumbering(kept, state.shares.size());
  BalancerState next = state;
  next.shares = shares;
  next.observation_rank.clear();
  next.observation_samples.clear();
  next.observation_seconds.clear();
  for (std::size_t k = 0; k < state.observation_rank.size(); ++k) {
    const int rank = index.at(state.observation_rank[k]);
    if (rank < 0) continue;
    next.observation_rank.push_back(rank);
    next.observation_samples.push_back(state.observation_samples[k]);
    next.observation_seconds.push_back(state.observation_seconds[k]);
  }
  next.held_rank.clear();
  next.held_samples.clear();
  next.held_seconds.clear();
  next.held_ratio.clear();
  for (std::size_t k = 0; k < state.held_rank.size(); ++k) {
    const int rank = index.at(state.held_rank[k]);
    if (rank < 0) continue;
    next.held_rank.push_back(rank);
    next.held_samples.push_back(state.held_samples[k]);
    next.held_seconds.push_back(state.held_seconds[k]);
    next.held_ratio.push_back(state.held_ratio[k]);
  }
  if (!state.fixed_seconds.empty()) {
    next.fixed_seconds.clear();
    for (int rank : kept) next.fixed_seconds.push_back(state.fixed_seconds.at(rank));
  }
  next.small_gain_updates = 0;
  next.small_gain_direction.clear();
  return next;
}

}  // namespace chorus::plan
