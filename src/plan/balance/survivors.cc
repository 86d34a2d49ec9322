#include "chorus/plan/survivors.h"

#include <algorithm>
#include <map>
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

// The balancer's records (observations, held steps) are parallel arrays with a rank each: the
// positions of those whose rank survives (index from renumbering), their new ranks, their values.
std::vector<std::size_t> survivingRecords(const std::vector<int>& ranks,
                                          const std::vector<int>& index) {
  std::vector<std::size_t> records;
  for (std::size_t k = 0; k < ranks.size(); ++k)
    if (index.at(ranks[k]) >= 0) records.push_back(k);
  return records;
}

std::vector<int> renumberedRanks(const std::vector<int>& ranks,
                                 const std::vector<std::size_t>& records,
                                 const std::vector<int>& index) {
  std::vector<int> renumbered;
  for (std::size_t k : records) renumbered.push_back(index.at(ranks[k]));
  return renumbered;
}

template <typename T>
std::vector<T> recordsOf(const std::vector<T>& values, const std::vector<std::size_t>& records) {
  std::vector<T> kept;
  for (std::size_t k : records) kept.push_back(values[k]);
  return kept;
}

// `batch` split in proportion to `weight` (all equal when they sum to nothing): largest remainder
// first, equal remainders to the lower index.
std::vector<std::int64_t> splitInProportion(std::int64_t batch, std::vector<double> weight) {
  double total = std::accumulate(weight.begin(), weight.end(), 0.0);
  if (total <= 0) {
    std::fill(weight.begin(), weight.end(), 1.0);
    total = static_cast<double>(weight.size());
  }
  std::vector<std::int64_t> result(weight.size());
  std::vector<std::pair<double, std::size_t>> remainders;
  std::int64_t given = 0;
  for (std::size_t i = 0; i < weight.size(); ++i) {
    const double exact = static_cast<double>(batch) * weight[i] / total;
    result[i] = static_cast<std::int64_t>(exact);
    given += result[i];
    remainders.push_back({exact - static_cast<double>(result[i]), i});
  }
  std::stable_sort(remainders.begin(), remainders.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (std::size_t k = 0; given < batch; ++k, ++given)
    ++result[remainders[k % weight.size()].second];
  return result;
}

// Rank -> its replica, for a plan of one-stage replicas.
std::map<int, const ReplicaPlan*> replicaOfRank(const Plan& plan) {
  std::map<int, const ReplicaPlan*> replica_of_rank;
  for (const ReplicaPlan& replica : plan.replicas) {
    CHORUS_CHECK_CONFIG(replica.stages.size() == 1, "survivors: a replica of ",
                        replica.stages.size(), " stages; only one-stage replicas regroup");
    replica_of_rank[replica.stages.front().rank] = &replica;
  }
  return replica_of_rank;
}

// `rank`'s entries of `plan`, as rank `index` of the next plan with `share` samples.
void addRank(Plan& next, const Plan& plan, const std::map<int, const ReplicaPlan*>& replicas,
             int rank, std::int64_t share) {
  CHORUS_CHECK_CONFIG(
      rank >= 0 && rank < static_cast<int>(plan.ranks.size()) && replicas.count(rank) > 0,
      "survivors: rank ", rank, " is not in a plan of ", plan.ranks.size());
  next.ranks.push_back(plan.ranks.at(rank));
  ReplicaPlan replica = *replicas.at(rank);
  StagePlan& stage = replica.stages.front();
  const bool one_pass = stage.micro_batch >= replica.share;
  replica.share = static_cast<int>(share);
  stage.rank = static_cast<int>(next.ranks.size()) - 1;
  if (one_pass) stage.micro_batch = std::max(1, replica.share);
  next.replicas.push_back(replica);
}

// ZeRO's shards of the next generation: the kept ranks' fractions, then each joiner's launch
// fraction scaled as the kept ranks' fractions grew since launch (`kept_slots`: their launch
// ranks; unscaled without them), all scaled to sum to 1. Shards sized by memory stay so: a rank's
// fraction is its headroom over the group's, and no rank's headroom depends on the others. Empty
// stays empty (even).
std::vector<double> regroupZeroShards(const Plan& current, const std::vector<int>& kept,
                                      const Plan& launch, const std::vector<int>& joiner_slots,
                                      const std::vector<int>& kept_slots) {
  if (current.zero_shards.empty()) return {};
  const auto launchFraction = [&launch](int slot) {
    return launch.zero_shards.empty() ? 1.0 / static_cast<double>(launch.ranks.size())
                                      : launch.zero_shards.at(slot);
  };
  std::vector<double> fractions;
  double now = 0, then = 0;
  for (int rank : kept) {
    fractions.push_back(current.zero_shards.at(rank));
    now += fractions.back();
  }
  for (int slot : kept_slots) then += launchFraction(slot);
  const double scale = kept_slots.size() == kept.size() && then > 0 ? now / then : 1.0;
  for (int slot : joiner_slots) fractions.push_back(launchFraction(slot) * scale);
  const double total = std::accumulate(fractions.begin(), fractions.end(), 0.0);
  CHORUS_CHECK_CONFIG(total > 0, "survivors: the kept ranks hold no ZeRO shard");
  for (double& fraction : fractions) fraction /= total;
  return fractions;
}

}  // namespace

Plan regroupPlan(const Plan& current, const std::vector<int>& kept, const Plan& launch,
                 const std::vector<int>& joiner_slots, const std::vector<std::int64_t>& shares,
                 const std::vector<int>& kept_slots) {
  checkKept(kept, current.ranks.size());
  CHORUS_CHECK_CONFIG(shares.size() == kept.size() + joiner_slots.size(),
                      "survivors: ", shares.size(), " shares for ",
                      kept.size() + joiner_slots.size(), " ranks");
  const auto current_replicas = replicaOfRank(current);
  const auto launch_replicas = replicaOfRank(launch);
  Plan next = current;
  next.ranks.clear();
  next.replicas.clear();
  std::size_t index = 0;
  for (int rank : kept) addRank(next, current, current_replicas, rank, shares[index++]);
  for (int slot : joiner_slots) addRank(next, launch, launch_replicas, slot, shares[index++]);
  next.zero_shards = regroupZeroShards(current, kept, launch, joiner_slots, kept_slots);
  return next;
}

std::vector<std::int64_t> survivorShares(const std::vector<std::int64_t>& shares,
                                         const std::vector<int>& kept) {
  return regroupShares(shares, kept, std::vector<std::int64_t>(kept.size(), 1), {});
}

std::vector<std::int64_t> regroupShares(const std::vector<std::int64_t>& shares,
                                        const std::vector<int>& kept,
                                        const std::vector<std::int64_t>& kept_planned,
                                        const std::vector<std::int64_t>& joiner_planned) {
  checkKept(kept, shares.size());
  CHORUS_CHECK_CONFIG(kept_planned.size() == kept.size(), "survivors: ", kept_planned.size(),
                      " planned shares for ", kept.size(), " survivors");
  const std::int64_t batch = std::accumulate(shares.begin(), shares.end(), std::int64_t{0});
  std::vector<double> weight;
  for (int rank : kept) weight.push_back(static_cast<double>(shares[rank]));
  const double now = std::accumulate(weight.begin(), weight.end(), 0.0);
  const double planned = static_cast<double>(
      std::accumulate(kept_planned.begin(), kept_planned.end(), std::int64_t{0}));
  const double scale = now > 0 && planned > 0 ? now / planned : 1.0;
  for (std::int64_t share : joiner_planned) weight.push_back(static_cast<double>(share) * scale);
  return splitInProportion(batch, weight);
}

BalancerState survivorBalancerState(const BalancerState& state, const std::vector<int>& kept,
                                    const std::vector<std::int64_t>& shares) {
  checkKept(kept, state.shares.size());
  CHORUS_CHECK_CONFIG(shares.size() >= kept.size(), "survivors: ", shares.size(), " shares for ",
                      kept.size(), " survivors");
  const std::vector<int> index = renumbering(kept, state.shares.size());
  BalancerState next = state;
  next.shares = shares;
  const auto observations = survivingRecords(state.observation_rank, index);
  next.observation_rank = renumberedRanks(state.observation_rank, observations, index);
  next.observation_samples = recordsOf(state.observation_samples, observations);
  next.observation_seconds = recordsOf(state.observation_seconds, observations);
  const auto held = survivingRecords(state.held_rank, index);
  next.held_rank = renumberedRanks(state.held_rank, held, index);
  next.held_samples = recordsOf(state.held_samples, held);
  next.held_seconds = recordsOf(state.held_seconds, held);
  next.held_ratio = recordsOf(state.held_ratio, held);
  if (!state.fixed_seconds.empty()) {
    next.fixed_seconds.clear();
    for (int rank : kept) next.fixed_seconds.push_back(state.fixed_seconds.at(rank));
    next.fixed_seconds.resize(shares.size(), 0.0);  // joiners: nothing remembered yet
  }
  next.small_gain_updates = 0;
  next.small_gain_direction.clear();
  return next;
}

int addJoinedDevice(Plan& launch, RankPlan rank, std::int64_t micro_batch) {
  replicaOfRank(launch);  // one-stage replicas only
  CHORUS_CHECK_CONFIG(!launch.replicas.empty(), "survivors: a launch plan without replicas");
  // ZeRO: the launch's mean shard, where nothing is known of the device's memory; the others keep
  // their proportions. Even shards (none listed) stay even.
  if (!launch.zero_shards.empty()) {
    const double ranks = static_cast<double>(launch.zero_shards.size());
    for (double& fraction : launch.zero_shards) fraction *= ranks / (ranks + 1);
    launch.zero_shards.push_back(1.0 / (ranks + 1));
  }
  std::int64_t total = 0;
  for (const ReplicaPlan& replica : launch.replicas) total += replica.share;
  const auto replicas = static_cast<std::int64_t>(launch.replicas.size());
  const std::int64_t share = std::max<std::int64_t>(1, (total + replicas / 2) / replicas);
  const int slot = static_cast<int>(launch.ranks.size());
  rank.device = slot;
  launch.ranks.push_back(std::move(rank));
  ReplicaPlan replica;
  replica.share = static_cast<int>(share);
  StagePlan stage = launch.replicas.front().stages.front();  // the layers, checkpointing
  stage.rank = slot;
  stage.micro_batch = static_cast<int>(micro_batch > 0 ? std::min(micro_batch, share) : share);
  replica.stages.push_back(stage);
  launch.replicas.push_back(replica);
  return slot;
}

}  // namespace chorus::plan
