// ZeRO shards by memory around each rank's replica of its successor's slice: the min-max of the
// headroom used, exact on small cases, never worse than the proportional split or any of many
// random splits over seeded random devices, and the memory model's terms as the runtime uses
// them.
#include "chorus/plan/replica_shards.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "chorus/core/error.h"
#include "plan/plan_test_util.h"

namespace chorus::plan {
namespace {

// The largest share of its headroom any rank uses under `fractions`.
double usedHeadroom(const std::vector<double>& fractions, const std::vector<double>& headroom,
                    double sharded, const std::vector<double>& replica) {
  const std::size_t n = fractions.size();
  double used = 0;
  for (std::size_t r = 0; r < n; ++r) {
    const double load = sharded * fractions[r] + (n > 1 ? replica[r] * fractions[(r + 1) % n] : 0);
    used = std::max(used, load / headroom[r]);
  }
  return used;
}

TEST(ReplicaShards, WithoutReplicasTheSplitIsProportional) {
  const auto [fractions, used] = shardsAroundReplicas({1, 2, 3}, 1, {0, 0, 0});
  ASSERT_EQ(fractions.size(), 3u);
  EXPECT_NEAR(fractions[0], 1.0 / 6, 1e-12);
  EXPECT_NEAR(fractions[1], 2.0 / 6, 1e-12);
  EXPECT_NEAR(fractions[2], 3.0 / 6, 1e-12);
  EXPECT_NEAR(used, 1.0 / 6, 1e-12);
}

// Two small devices beside a large one, a replica as large as a slice: the proportional split
// (1/6, 1/6, 2/3) fills rank 1 to 5/6 with its slice and rank 2's replica; the best gives rank 1
// nothing, so that both small ones hold half a slice or half a replica.
TEST(ReplicaShards, TheFullestDeviceIsAsEmptyAsItCanBe) {
  const std::vector<double> headroom = {1, 1, 4}, replica = {1, 1, 1};
  const auto [fractions, used] = shardsAroundReplicas(headroom, 1, replica);
  EXPECT_NEAR(used, 0.5, 1e-12);
  EXPECT_NEAR(fractions[0], 0.5, 1e-12);
  EXPECT_NEAR(fractions[1], 0.0, 1e-12);
  EXPECT_NEAR(fractions[2], 0.5, 1e-12);
  EXPECT_NEAR(usedHeadroom(fractions, headroom, 1, replica), used, 1e-12);
  EXPECT_NEAR(usedHeadroom({1.0 / 6, 1.0 / 6, 4.0 / 6}, headroom, 1, replica), 5.0 / 6, 1e-12);
}

// Equal devices, an even count: the system that asks every rank for the same relative headroom
// is singular here, the linear program is not, and of its optimal splits (the vertex leaves every
// other rank empty) the even one is taken.
TEST(ReplicaShards, EqualDevicesOfAnEvenCountSplitEvenly) {
  const auto [fractions, used] = shardsAroundReplicas({2, 2, 2, 2}, 1, {1, 1, 1, 1});
  EXPECT_NEAR(used, 0.25, 1e-12);  // every rank: a quarter slice and a quarter replica of 2
  for (double fraction : fractions) EXPECT_NEAR(fraction, 0.25, 1e-12);
  const auto [two, two_used] = shardsAroundReplicas({2, 2}, 1, {1, 1});
  EXPECT_NEAR(two_used, 0.5, 1e-12);
  EXPECT_NEAR(two[0], 0.5, 1e-12);
}

// Seeded random devices: the split sums to 1, is never negative, uses what it says, and no
// proportional or random split does better.
TEST(ReplicaShards, NoOtherSplitUsesLessHeadroom) {
  std::mt19937 random(7);
  std::uniform_real_distribution<double> room(0.2, 5.0), ratio(0.3, 1.5), unit(0.0, 1.0);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + trial % 8;
    std::vector<double> headroom, replica;
    for (int r = 0; r < n; ++r) {
      headroom.push_back(room(random));
      replica.push_back(ratio(random));
    }
    const auto [fractions, used] = shardsAroundReplicas(headroom, 1, replica);
    double total = 0;
    for (double fraction : fractions) {
      EXPECT_GE(fraction, -1e-12);
      total += fraction;
    }
    ASSERT_NEAR(total, 1, 1e-9) << "trial " << trial;
    EXPECT_NEAR(usedHeadroom(fractions, headroom, 1, replica), used, 1e-9) << "trial " << trial;
    std::vector<double> proportional;
    double sum = 0;
    for (double h : headroom) sum += h;
    for (double h : headroom) proportional.push_back(h / sum);
    EXPECT_LE(used, usedHeadroom(proportional, headroom, 1, replica) + 1e-9) << "trial " << trial;
    for (int sample = 0; sample < 200; ++sample) {
      std::vector<double> other;
      double other_sum = 0;
      for (int r = 0; r < n; ++r) other_sum += other.emplace_back(unit(random));
      for (double& value : other) value /= other_sum;
      EXPECT_LE(used, usedHeadroom(other, headroom, 1, replica) + 1e-9) << "trial " << trial;
    }
  }
}

// Through the memory model, as zero.shards = "memory" with zero.redundancy = 1 sizes them: the
// replica (state, master copy and gradient of the successor's slice) costs what a slice does.
TEST(ReplicaShards, TheMemoryModelsSplitFitsEveryBudgetOrSaysByHowMuchNot) {
  const MemoryModel model(testing::uniformModel(4, 1e6, 1e9, 1e6, 1e4));
  std::vector<StageMemoryRequest> requests(3, zeroShardRequest(4, Dtype::kFp32, 2, 3));
  const std::vector<std::string> names = {"a", "b", "c"};
  // What the fractions must fit: find the unsharded part and the sharded state from the model.
  StageMemoryRequest whole = requests[0], none = requests[0];
  whole.shard_fraction = 1;
  none.shard_fraction = 1e-12;
  const double fixed = model.peakBytes(none), sharded = model.peakBytes(whole) - fixed;
  const std::vector<double> usable = {fixed + 0.6 * sharded, fixed + 0.6 * sharded,
                                      fixed + 2 * sharded};
  const std::vector<double> fractions = zeroShardsWithReplicas(model, requests, usable, names);
  for (int r = 0; r < 3; ++r) {
    StageMemoryRequest request = requests[r];
    request.shard_fraction = std::max(fractions[r], 1e-12);
    request.replica_fraction = fractions[(r + 1) % 3];
    EXPECT_LE(model.peakBytes(request), usable[r] * (1 + 1e-9)) << names[r];
  }
  const std::vector<double> tight = {fixed + 0.3 * sharded, fixed + 0.3 * sharded,
                                     fixed + 0.3 * sharded};
  try {
    zeroShardsWithReplicas(model, requests, tight, names);
    ADD_FAILURE() << "a split that fits nowhere was accepted";
  } catch (const ConfigError& error) {
    EXPECT_NE(error.message().find("the best split needs 222% of the headroom"), std::string::npos)
        << error.message();
  }
}

}  // namespace
}  // namespace chorus::plan
