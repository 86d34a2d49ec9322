// What survivors carry over when data-parallel ranks are lost: the batch split over them in
// proportion to their shares, and the balancer's knowledge of them kept and renumbered.
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

}  // namespace
}  // namespace chorus::plan
