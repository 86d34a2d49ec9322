// What survivors carry over when data-parallel ranks are lost: the batch split over them in
// proportion to their shares, a share for each worker that joins, and the balancer's knowledge of
// them kept and renumbered.
#include "chorus/plan/survivors.h"

#include <gtest/gtest.h>

#include <numeric>

#include "chorus/core/error.h"

namespace chorus::plan {
namespace {

std::int64_t sum(const std::vector<std::int64_t>& values) {
  return std::accumulate(values.begin(), values.end(), std::int64_t{0});
}

TEST(SurvivorShares, LostSamplesGoToSurvivorsInProportion) {
  // 30 + 20 + 14 = 64; rank 1 lost: 30 : 14 of 64 is 43.6 : 20.4.
  EXPECT_EQ(survivorShares({30, 20, 14}, {0, 2}), (std::vector<std::int64_t>{44, 20}));
  EXPECT_EQ(survivorShares({16, 16, 16, 16}, {1, 2, 3}), (std::vector<std::int64_t>{22, 21, 21}));
  EXPECT_EQ(survivorShares({10, 54}, {0}), (std::vector<std::int64_t>{64}));
}

TEST(SurvivorShares, AlwaysSumToTheGlobalBatch) {
  for (std::int64_t a = 0; a <= 13; ++a)
    for (std::int64_t b = 0; b <= 13; ++b) {
      const std::vector<std::int64_t> shares{a, b, 13 - a, 7};
      for (const std::vector<int>& kept :
           std::vector<std::vector<int>>{{0}, {1, 3}, {0, 1, 2}, {2}, {0, 2, 3}}) {
        const auto next = survivorShares(shares, kept);
        ASSERT_EQ(next.size(), kept.size());
        EXPECT_EQ(sum(next), sum(shares)) << a << " " << b;
        for (std::int64_t share : next) EXPECT_GE(share, 0);
      }
    }
}

TEST(SurvivorShares, SurvivorsWithoutSamplesSplitEvenly) {
  EXPECT_EQ(survivorShares({12, 0, 0}, {1, 2}), (std::vector<std::int64_t>{6, 6}));
  EXPECT_EQ(survivorShares({11, 0, 0}, {1, 2}), (std::vector<std::int64_t>{6, 5}));
}

TEST(SurvivorShares, RefusesBadSurvivorLists) {
  EXPECT_THROW(survivorShares({4, 4}, {}), ConfigError);
  EXPECT_THROW(survivorShares({4, 4}, {2}), ConfigError);
  EXPECT_THROW(survivorShares({4, 4}, {1, 0}), ConfigError);
}

TEST(SurvivorBalancerState, KeepsAndRenumbersTheSurvivorsObservations) {
  BalancerState state;
  state.shares = {10, 20, 34};
  state.steps_observed = 7;
  state.observation_rank = {0, 1, 2, 0, 1, 2};
  state.observation_samples = {10, 20, 34, 10, 20, 34};
  state.observation_seconds = {0.1, 0.2, 0.3, 0.11, 0.21, 0.31};
  state.held_rank = {2, 1};
  state.held_samples = {34, 20};
  state.held_seconds = {0.9, 0.4};
  state.held_ratio = {3.0, 2.0};
  state.fixed_seconds = {0.01, 0.02, 0.03};
  state.small_gain_updates = 3;
  state.small_gain_direction = {1, -1, 0};
  const BalancerState next = survivorBalancerState(state, {1, 2}, {25, 39});
  EXPECT_EQ(next.shares, (std::vector<std::int64_t>{25, 39}));
  EXPECT_EQ(next.steps_observed, 7);
  EXPECT_EQ(next.observation_rank, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(next.observation_samples, (std::vector<std::int64_t>{20, 34, 20, 34}));
  EXPECT_EQ(next.observation_seconds, (std::vector<double>{0.2, 0.3, 0.21, 0.31}));
  EXPECT_EQ(next.held_rank, (std::vector<int>{1, 0}));
  EXPECT_EQ(next.held_ratio, (std::vector<double>{3.0, 2.0}));
  EXPECT_EQ(next.fixed_seconds, (std::vector<double>{0.02, 0.03}));
  EXPECT_EQ(next.small_gain_updates, 0);
  EXPECT_TRUE(next.small_gain_direction.empty());
}

TEST(SurvivorBalancerState, TheBalancerTakesIt) {
  BalancerOptions options;
  LoadBalancer balancer(options, 3, 60, {});
  for (int step = 1; step <= 6; ++step) balancer.update(step, {0.1, 0.2, 0.3});
  const BalancerState before = balancer.exportState();
  const auto shares = survivorShares(before.shares, {0, 2});
  LoadBalancer survivors(options, 2, 60, {});
  survivors.importState(survivorBalancerState(before, {0, 2}, shares));
  EXPECT_EQ(survivors.shares(), shares);
}

TEST(RegroupShares, AReplacedWorkerBringsBackTheLaunchShares) {
  // Launch [10, 20, 40, 50]; rank 1 lost: the survivors held [12, 48, 60] of 120. Its replacement
  // counts as 20 x 120/100 = 24: [12, 48, 60, 24] of 144 is [10, 40, 50, 20] of 120.
  const auto after_loss = survivorShares({10, 20, 40, 50}, {0, 2, 3});
  EXPECT_EQ(after_loss, (std::vector<std::int64_t>{12, 48, 60}));
  EXPECT_EQ(regroupShares(after_loss, {0, 1, 2}, {10, 40, 50}, {20}),
            (std::vector<std::int64_t>{10, 40, 50, 20}));
}

TEST(RegroupShares, WithoutJoinersItIsSurvivorShares) {
  EXPECT_EQ(regroupShares({30, 20, 14}, {0, 2}, {5, 9}, {}), survivorShares({30, 20, 14}, {0, 2}));
}

TEST(RegroupShares, JoinersScaleWithWhatTheSurvivorsRunNow) {
  // The survivors run twice their planned shares (the lost ranks' samples went to them): a
  // joiner planned at 16 counts as 32. The batch of 64 over [40, 24, 32] is 26.7 : 16 : 21.3.
  const auto shares = regroupShares({40, 24}, {0, 1}, {20, 12}, {16});
  EXPECT_EQ(shares, (std::vector<std::int64_t>{27, 16, 21}));
  EXPECT_EQ(sum(shares), 64);
  // Two joiners, batch of 64 over weights [40, 24, 32, 32].
  const auto two = regroupShares({40, 24}, {0, 1}, {20, 12}, {16, 16});
  EXPECT_EQ(sum(two), 64);
  EXPECT_EQ(two, (std::vector<std::int64_t>{20, 12, 16, 16}));
}

TEST(RegroupShares, SizesThatDifferAreRefused) {
  EXPECT_THROW(regroupShares({4, 4}, {0, 1}, {4}, {4}), ConfigError);
}

TEST(SurvivorBalancerState, JoinersComeAfterTheSurvivorsWithNothingObserved) {
  BalancerState state;
  state.shares = {30, 34};
  state.observation_rank = {0, 1};
  state.observation_samples = {30, 34};
  state.observation_seconds = {0.3, 0.2};
  state.fixed_seconds = {0.01, 0.02};
  const BalancerState next = survivorBalancerState(state, {1}, {40, 24});
  EXPECT_EQ(next.shares, (std::vector<std::int64_t>{40, 24}));
  EXPECT_EQ(next.observation_rank, (std::vector<int>{0}));
  EXPECT_EQ(next.fixed_seconds, (std::vector<double>{0.02, 0.0}));
  BalancerOptions options;
  LoadBalancer balancer(options, 2, 64, {});
  balancer.importState(next);
  EXPECT_EQ(balancer.shares(), next.shares);
}

// A one-stage data-parallel plan of `shares`, rank r on device r; rank 1 accumulates in
// micro-batches of 4, the others run their share in one pass.
Plan dataParallelPlan(const std::vector<int>& shares) {
  Plan plan;
  plan.global_batch = 0;
  for (std::size_t r = 0; r < shares.size(); ++r) {
    RankPlan rank;
    rank.device = static_cast<int>(r);
    rank.device_type = "cpu" + std::to_string(r);
    plan.ranks.push_back(rank);
    ReplicaPlan replica;
    replica.share = shares[r];
    StagePlan stage;
    stage.last_layer = 3;
    stage.rank = static_cast<int>(r);
    stage.micro_batch = r == 1 ? 4 : shares[r];
    replica.stages.push_back(stage);
    plan.replicas.push_back(replica);
    plan.global_batch += shares[r];
  }
  return plan;
}

TEST(RegroupPlan, SurvivorsThenJoinersTakeTheirLaunchEntries) {
  const Plan launch = dataParallelPlan({10, 20, 40, 50});
  const Plan survivors = regroupPlan(launch, {0, 2, 3}, launch, {}, {12, 48, 60});
  ASSERT_EQ(survivors.ranks.size(), 3u);
  EXPECT_EQ(survivors.ranks[1].device_type, "cpu2");
  EXPECT_EQ(survivors.replicas[1].share, 48);
  EXPECT_EQ(survivors.replicas[1].stages[0].rank, 1);
  EXPECT_EQ(survivors.replicas[1].stages[0].micro_batch, 48);  // one pass stays one pass
  // Launch rank 1's replacement joins: it takes launch rank 1's entry, as rank 3.
  const Plan joined = regroupPlan(survivors, {0, 1, 2}, launch, {1}, {10, 40, 50, 20});
  ASSERT_EQ(joined.ranks.size(), 4u);
  EXPECT_EQ(joined.ranks[3].device_type, "cpu1");
  EXPECT_EQ(joined.replicas[3].share, 20);
  EXPECT_EQ(joined.replicas[3].stages[0].rank, 3);
  EXPECT_EQ(joined.replicas[3].stages[0].micro_batch, 4);  // it accumulated, and still does
  EXPECT_EQ(joined.replicas[0].share, 10);
  EXPECT_EQ(joined.global_batch, 120);
}

TEST(RegroupPlan, ZeroShardsKeepTheirProportions) {
  Plan launch = dataParallelPlan({10, 20, 40, 50});
  launch.zero_stage = 2;
  launch.zero_shards = {0.1, 0.2, 0.3, 0.4};
  const Plan survivors = regroupPlan(launch, {0, 2, 3}, launch, {}, {12, 48, 60});
  ASSERT_EQ(survivors.zero_shards.size(), 3u);
  EXPECT_DOUBLE_EQ(survivors.zero_shards[0], 0.125);
  EXPECT_DOUBLE_EQ(survivors.zero_shards[1], 0.375);
  EXPECT_DOUBLE_EQ(survivors.zero_shards[2], 0.5);
  EXPECT_NO_THROW(survivors.validate(launch.replicas[0].stages[0].last_layer));
  // Launch rank 1's replacement brings back the launch fractions: the survivors (launch ranks 0,
  // 2, 3) grew from 0.8 to 1 in all, and its 0.2 grows with them.
  const Plan joined = regroupPlan(survivors, {0, 1, 2}, launch, {1}, {10, 40, 50, 20}, {0, 2, 3});
  ASSERT_EQ(joined.zero_shards.size(), 4u);
  const std::vector<double> launch_order{0.1, 0.3, 0.4, 0.2};
  for (size_t r = 0; r < 4; ++r) EXPECT_NEAR(joined.zero_shards[r], launch_order[r], 1e-12);
  // Even shards stay even.
  launch.zero_shards.clear();
  EXPECT_TRUE(regroupPlan(launch, {0, 2}, launch, {}, {60, 60}).zero_shards.empty());
}

TEST(RegroupPlan, WrongSizesAndSlotsAreRefused) {
  const Plan launch = dataParallelPlan({10, 20});
  EXPECT_THROW(regroupPlan(launch, {0}, launch, {}, {10, 20}), ConfigError);
  EXPECT_THROW(regroupPlan(launch, {0}, launch, {5}, {10, 20}), ConfigError);
}

TEST(AddJoinedDevice, ANewDeviceTakesTheLaunchMeanShareAndRegroupsLikeALaunchRank) {
  Plan launch = dataParallelPlan({10, 20, 40, 51});
  RankPlan device;
  device.device_type = "cpu@0.5";
  device.node = "node1";
  const int slot = addJoinedDevice(launch, device, 0);
  EXPECT_EQ(slot, 4);
  ASSERT_EQ(launch.ranks.size(), 5u);
  EXPECT_EQ(launch.ranks[4].device_type, "cpu@0.5");
  EXPECT_EQ(launch.ranks[4].device, 4);
  EXPECT_EQ(launch.replicas[4].share, 30);  // 121 / 4, rounded
  EXPECT_EQ(launch.replicas[4].stages[0].rank, 4);
  EXPECT_EQ(launch.replicas[4].stages[0].micro_batch, 30);  // one pass
  EXPECT_EQ(launch.replicas[4].stages[0].last_layer, 3);
  // Joining four running members as their fifth rank: its entry, renumbered.
  const Plan current = dataParallelPlan({10, 20, 40, 51});
  const Plan joined = regroupPlan(current, {0, 1, 2, 3}, launch, {slot}, {8, 16, 32, 41, 24});
  ASSERT_EQ(joined.ranks.size(), 5u);
  EXPECT_EQ(joined.ranks[4].node, "node1");
  EXPECT_EQ(joined.replicas[4].share, 24);
  EXPECT_EQ(joined.replicas[4].stages[0].micro_batch, 24);
  // A micro-batch cap applies; a second device gets the next slot.
  EXPECT_EQ(addJoinedDevice(launch, device, 8), 5);
  EXPECT_EQ(launch.replicas[5].stages[0].micro_batch, 8);
}

// ZeRO: the new device's shard is the launch's mean one, the others keep their proportions, and
// the next generation's shards follow from that launch plan as for any joiner.
TEST(AddJoinedDevice, ANewDeviceOfAZeroJobTakesTheMeanShard) {
  Plan launch = dataParallelPlan({10, 20});
  launch.zero_stage = 2;
  launch.zero_shards = {0.25, 0.75};
  const int slot = addJoinedDevice(launch, RankPlan{}, 0);
  ASSERT_EQ(launch.zero_shards.size(), 3u);
  EXPECT_DOUBLE_EQ(launch.zero_shards[0], 0.25 * 2 / 3);
  EXPECT_DOUBLE_EQ(launch.zero_shards[1], 0.75 * 2 / 3);
  EXPECT_DOUBLE_EQ(launch.zero_shards[2], 1.0 / 3);
  EXPECT_NO_THROW(launch.validateZeroShards());
  Plan current = dataParallelPlan({10, 20});
  current.zero_stage = 2;
  current.zero_shards = {0.25, 0.75};
  const Plan joined = regroupPlan(current, {0, 1}, launch, {slot}, {10, 10, 10}, {0, 1});
  ASSERT_EQ(joined.zero_shards.size(), 3u);
  EXPECT_NEAR(joined.zero_shards[2], 1.0 / 3, 1e-12);
  EXPECT_NEAR(joined.zero_shards[0] / joined.zero_shards[1], 1.0 / 3, 1e-12);
  // Even shards stay even (none listed).
  Plan even = dataParallelPlan({10, 20});
  even.zero_stage = 1;
  addJoinedDevice(even, RankPlan{}, 0);
  EXPECT_TRUE(even.zero_shards.empty());
}

TEST(AddJoinedDevice, PipelinesAreRefused) {
  Plan pipeline = dataParallelPlan({10, 20});
  pipeline.replicas[0].stages.push_back(pipeline.replicas[1].stages[0]);
  pipeline.replicas.pop_back();
  EXPECT_THROW(addJoinedDevice(pipeline, RankPlan{}, 0), ConfigError);
}

}  // namespace
}  // namespace chorus::plan
