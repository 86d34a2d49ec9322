#include "chorus/plan/balancer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <regex>

#include "chorus/core/error.h"

namespace chorus::plan {
namespace {

int64_t sum(const std::vector<int64_t>& shares) {
  return std::accumulate(shares.begin(), shares.end(), int64_t{0});
}

// The best max-time over every integer split of `batch` over three ranks, by enumeration.
double bruteForceBest(const std::vector<RankTiming>& timings, int64_t batch,
                      const std::vector<int64_t>& caps) {
  const auto fits = [&](size_t i, int64_t b) { return caps[i] <= 0 || b <= caps[i]; };
  double best = INFINITY;
  for (int64_t b0 = 0; b0 <= batch; ++b0)
    for (int64_t b1 = 0; b0 + b1 <= batch; ++b1) {
      const int64_t b2 = batch - b0 - b1;
      if (!fits(0, b0) || !fits(1, b1) || !fits(2, b2)) continue;
      best = std::min(best, predictedStepSeconds(timings, {b0, b1, b2}));
    }
  return best;
}

// A step run at other shares than the balancer's (a Python DataLoader that read its sampler
// ahead) is fitted at the samples it really ran: two equally fast ranks that ran 80 and 20
// samples in 0.8 s and 0.2 s stay at an even split, where fitting the times to the balancer's
// 50 : 50 would make rank 0 look four times slower.
TEST(LoadBalancer, FitsTheSamplesAStepReallyRan) {
  BalancerOptions options;
  options.cooldown_steps = 0;
  LoadBalancer balancer(options, 2, 100);
  for (int step = 1; step <= 8; ++step) balancer.update(step, {0.8, 0.2}, {80, 20});
  EXPECT_EQ(balancer.shares(), (std::vector<int64_t>{50, 50}));
  LoadBalancer fooled(options, 2, 100);
  for (int step = 1; step <= 8; ++step) fooled.update(step, {0.8, 0.2});
  EXPECT_LT(fooled.shares()[0], 30);
  EXPECT_THROW(balancer.update(9, {0.1, 0.1}, {50}), ConfigError);
}

TEST(BalanceShares, MatchesBruteForceOnSmallInstances) {
  std::mt19937 random(20240611);
  std::uniform_real_distribution<double> fixed(0.0, 0.5), per_sample(0.01, 1.0);
  int checked = 0;
  for (int instance = 0; instance < 400; ++instance) {
    const int64_t batch = static_cast<int64_t>(random() % 13);
    std::vector<RankTiming> timings;
    std::vector<int64_t> caps;
    for (int i = 0; i < 3; ++i) {
      // Every other instance without fixed costs, where ties are common.
      timings.push_back({instance % 2 ? fixed(random) : 0.0, per_sample(random)});
      caps.push_back(random() % 3 == 0 ? static_cast<int64_t>(random() % 6) : 0);
    }
    int64_t room = 0;
    for (int64_t cap : caps) room += cap > 0 ? cap : batch;
    if (room < batch) {
      EXPECT_THROW(balanceShares(timings, batch, caps), ConfigError);
      continue;
    }
    const std::vector<int64_t> shares = balanceShares(timings, batch, caps);
    ASSERT_EQ(sum(shares), batch);
    for (int i = 0; i < 3; ++i) {
      EXPECT_GE(shares[i], 0);
      if (caps[i] > 0) {
        EXPECT_LE(shares[i], caps[i]);
      }
    }
    EXPECT_DOUBLE_EQ(predictedStepSeconds(timings, shares), bruteForceBest(timings, batch, caps))
        << "instance " << instance << " batch " << batch;
    ++checked;
  }
  EXPECT_GT(checked, 300);
}

TEST(BalanceShares, RespectsCapsAndSumsToTheBatch) {
  const std::vector<RankTiming> timings{{0, 1e-3}, {0, 2e-3}, {0, 4e-3}};
  const std::vector<int64_t> shares = balanceShares(timings, 700, {300, 0, 250});
  EXPECT_EQ(sum(shares), 700);
  EXPECT_EQ(shares[0], 300);  // the fast rank wants 400 but holds only 300
  EXPECT_LE(shares[2], 250);
  EXPECT_EQ(shares, (std::vector<int64_t>{300, 267, 133}));
}

TEST(BalanceShares, RankFourTimesSlowerGetsAQuarterTheShare) {
  EXPECT_EQ(balanceShares({{0, 1e-3}, {0, 4e-3}}, 100), (std::vector<int64_t>{80, 20}));
  EXPECT_EQ(balanceShares({{0.01, 1e-3}, {0.01, 4e-3}}, 1000), (std::vector<int64_t>{800, 200}));
}

TEST(BalanceShares, IdlesARankWhoseFixedCostExceedsTheOthersWork) {
  // Rank 1 would need 10 s for a single sample; rank 0 finishes all five in 5 s.
  EXPECT_EQ(balanceShares({{0, 1}, {10, 1}}, 5), (std::vector<int64_t>{5, 0}));
  EXPECT_EQ(balanceShares({{0, 1}, {10, 1}}, 20), (std::vector<int64_t>{15, 5}));
}

TEST(BalanceShares, TiesGoToTheLowestRanksDeterministically) {
  const std::vector<RankTiming> same(3, RankTiming{0.0, 1.0});
  EXPECT_EQ(balanceShares(same, 5), (std::vector<int64_t>{2, 2, 1}));
  EXPECT_EQ(balanceShares(same, 0), (std::vector<int64_t>{0, 0, 0}));
  const std::vector<RankTiming> mixed{{0.1, 0.3}, {0.05, 0.7}, {0.0, 0.11}, {0.2, 0.05}};
  const std::vector<int64_t> first = balanceShares(mixed, 1001, {0, 0, 90, 0});
  for (int again = 0; again < 3; ++again)
    EXPECT_EQ(balanceShares(mixed, 1001, {0, 0, 90, 0}), first);
}

TEST(BalanceShares, RejectsImpossibleInput) {
  const std::vector<RankTiming> timings{{0, 1}, {0, 1}};
  EXPECT_THROW(balanceShares(timings, 10, {4, 5}), ConfigError);
  EXPECT_THROW(balanceShares(timings, 10, {4}), ConfigError);
  EXPECT_THROW(balanceShares(timings, -1), ConfigError);
  EXPECT_THROW(balanceShares({}, 10), ConfigError);
  EXPECT_THROW(balanceShares({{0, 0}, {0, 1}}, 10), ConfigError);
  EXPECT_THROW(balanceShares({{-1, 1}, {0, 1}}, 10), ConfigError);
  EXPECT_THROW(balanceShares({{0, NAN}, {0, 1}}, 10), ConfigError);
}

TEST(Shares, EqualGivesTheRemainderToTheLowestRanks) {
  EXPECT_EQ(equalShares(10, 3), (std::vector<int64_t>{4, 3, 3}));
  EXPECT_EQ(equalShares(64, 3), (std::vector<int64_t>{22, 21, 21}));
  EXPECT_EQ(equalShares(2, 4), (std::vector<int64_t>{1, 1, 0, 0}));
  EXPECT_THROW(equalShares(10, 0), ConfigError);
}

TEST(Shares, ProportionalUsesLargestRemainders) {
  EXPECT_EQ(proportionalShares(7, {2, 1}), (std::vector<int64_t>{5, 2}));
  EXPECT_EQ(proportionalShares(10, {1, 1, 1}), (std::vector<int64_t>{4, 3, 3}));
  EXPECT_EQ(proportionalShares(70, {1.0, 0.5, 0.25}), (std::vector<int64_t>{40, 20, 10}));
  EXPECT_EQ(proportionalShares(10, {0.3, 0.3, 0.4}), (std::vector<int64_t>{3, 3, 4}));
  EXPECT_EQ(proportionalShares(5, {0, 1}), (std::vector<int64_t>{0, 5}));
  EXPECT_THROW(proportionalShares(5, {0, 0}), ConfigError);
  EXPECT_THROW(proportionalShares(5, {}), ConfigError);
  EXPECT_THROW(proportionalShares(5, {-1, 2}), ConfigError);
}

TEST(SpeedModel, RecoversAnExactAffineModel) {
  SpeedModel model;
  for (int64_t b : {10, 20, 30, 40, 25}) model.observe(b, 0.02 + 0.003 * b);
  EXPECT_NEAR(model.timing().a, 0.02, 1e-12);
  EXPECT_NEAR(model.timing().c, 0.003, 1e-12);
}

TEST(SpeedModel, SingleBatchSizeAssumesNoFixedCost) {
  SpeedModel model;
  for (double t : {0.10, 0.12, 0.11, 0.50}) model.observe(50, t);
  EXPECT_EQ(model.timing().a, 0.0);
  // the mean of the inliers 0.10, 0.11, 0.12 (0.50 is an outlier), per sample
  EXPECT_NEAR(model.timing().c, 0.11 / 50, 1e-15);
}

TEST(SpeedModel, IgnoresAStalledStep) {
  SpeedModel model;
  const int64_t sizes[] = {10, 20, 30, 40, 50, 15, 25, 35};
  for (int64_t b : sizes) model.observe(b, 0.01 + 0.002 * b);
  model.observe(30, 5.0);  // a step that stalled on I/O
  EXPECT_NEAR(model.timing().a, 0.01, 1e-9);
  EXPECT_NEAR(model.timing().c, 0.002, 1e-9);
}

TEST(SpeedModel, NeverReportsNegativeFixedCostOrNonPositiveSlope) {
  SpeedModel negative_intercept;
  for (int64_t b : {10, 20, 30}) negative_intercept.observe(b, -0.05 + 0.01 * b);
  EXPECT_EQ(negative_intercept.timing().a, 0.0);
  EXPECT_GT(negative_intercept.timing().c, 0.0);

  SpeedModel decreasing;  // noise larger than the per-sample cost
  for (int64_t b : {10, 20, 30, 40}) decreasing.observe(b, 1.0 - 0.001 * b);
  EXPECT_GE(decreasing.timing().a, 0.0);
  EXPECT_GT(decreasing.timing().c, 0.0);

  SpeedModel zero;
  zero.observe(10, 0.0);
  EXPECT_GE(zero.timing().c, SpeedModel::kMinSecondsPerSample);
}

TEST(SpeedModel, FollowsASpeedChangeWithinHalfAWindow) {
  SpeedModel model(16);
  for (int i = 0; i < 16; ++i) model.observe(100, 0.4);
  int steps = 0;
  while (std::fabs(model.timing().c - 0.002) > 1e-12 && steps < 16) {
    model.observe(100, 0.2);
    ++steps;
  }
  EXPECT_LE(steps, 9);
  EXPECT_NEAR(model.timing().c, 0.002, 1e-12);
}

TEST(SpeedModel, KeepsOnlyTheWindowAndDropsUselessObservations) {
  SpeedModel model(4);
  model.observe(0, 1.0);
  model.observe(10, -1.0);
  model.observe(10, NAN);
  EXPECT_TRUE(model.observations().empty());
  EXPECT_EQ(model.timing().c, 1.0);  // the neutral starting value
  for (int i = 1; i <= 6; ++i) model.observe(i * 10, 0.1 * i);
  ASSERT_EQ(model.observations().size(), 4u);
  EXPECT_EQ(model.observations().front().samples, 30);
  model.reset();
  EXPECT_TRUE(model.observations().empty());
  EXPECT_THROW(SpeedModel(1), ConfigError);
}

// A deterministic stand-in for measurement noise: uniform in [-1, 1], a function of (step, rank).
double noise(int64_t step, int rank) {
  uint64_t x = static_cast<uint64_t>(step) * 0x9E3779B97F4A7C15ull + rank * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return static_cast<double>(x % 2000001) / 1000000.0 - 1.0;
}

// Feeds one step's compute times (t = b·c_i ± 5%) and returns whether the shares changed.
bool step(LoadBalancer& balancer, int64_t index, const std::vector<double>& per_sample) {
  std::vector<double> seconds;
  for (size_t i = 0; i < per_sample.size(); ++i)
    seconds.push_back(balancer.shares()[i] * per_sample[i] *
                      (1.0 + 0.05 * noise(index, static_cast<int>(i))));
  return balancer.update(index, seconds);
}

bool within(const std::vector<int64_t>& shares, const std::vector<double>& target,
            double tolerance) {
  for (size_t i = 0; i < shares.size(); ++i)
    if (std::fabs(shares[i] - target[i]) > tolerance * target[i]) return false;
  return true;
}

constexpr int64_t kBatch = 700;
const std::vector<double> kPerSample{1e-3, 2e-3, 4e-3};  // speeds 1, 0.5, 0.25
const std::vector<double> kIdeal{400, 200, 100};         // {4/7, 2/7, 1/7} of 700

// The largest number of samples any rank gained or lost between two share vectors.
int64_t largestMove(const std::vector<int64_t>& from, const std::vector<int64_t>& to) {
  int64_t largest = 0;
  for (size_t i = 0; i < from.size(); ++i) largest = std::max(largest, std::abs(to[i] - from[i]));
  return largest;
}

// No dead band: the shares converge to the speed ratio and stay near it. What moves is left under
// ±5% noise is a correction of a few samples, not a swing.
TEST(LoadBalancer, SharesConvergeToSpeedRatioThenStayNearIt) {
  LoadBalancer balancer(BalancerOptions{}, 3, kBatch);
  EXPECT_EQ(balancer.shares(), (std::vector<int64_t>{234, 233, 233}));
  int64_t i = 0;
  for (; i < 13; ++i) step(balancer, i, kPerSample);
  for (; i < 100; ++i) {
    const std::vector<int64_t> before = balancer.shares();
    step(balancer, i, kPerSample);
    EXPECT_TRUE(within(balancer.shares(), kIdeal, 0.03))
        << i << ": " << balancer.shares()[0] << "," << balancer.shares()[1] << ","
        << balancer.shares()[2];
    EXPECT_LE(largestMove(before, balancer.shares()), kBatch * 3 / 100) << balancer.lastChange();
  }
}

TEST(LoadBalancer, NoiseAloneMovesOnlyAFewSamplesAtTheOptimum) {
  // Profiled at the balanced shares, 200 steps of ±5% noise keep them within 3% of it.
  LoadBalancer balancer(BalancerOptions{}, 3, kBatch);
  BalancerState state = balancer.exportState();
  state.shares = {400, 200, 100};
  balancer.importState(state);
  int changes = 0;
  for (int64_t i = 0; i < 200; ++i) {
    changes += step(balancer, i, kPerSample);
    EXPECT_TRUE(within(balancer.shares(), kIdeal, 0.03)) << balancer.lastChange();
  }
  EXPECT_LE(changes, 20);
}

TEST(LoadBalancer, SharesFollowASpeedChange) {
  LoadBalancer balancer(BalancerOptions{}, 3, kBatch);
  int64_t i = 0;
  for (; i < 40; ++i) step(balancer, i, kPerSample);
  ASSERT_TRUE(within(balancer.shares(), kIdeal, 0.05));
  const std::vector<double> faster{1e-3, 2e-3, 2e-3};  // rank 2 now runs at speed 0.5
  const std::vector<double> ideal{350, 175, 175};
  const int64_t change = i;
  // Within 20 steps the shares are near the new balance; a settling look may refine them later.
  for (; i < change + 20; ++i) step(balancer, i, faster);
  EXPECT_TRUE(within(balancer.shares(), ideal, 0.10))
      << balancer.shares()[0] << "," << balancer.shares()[1] << "," << balancer.shares()[2];
  for (; i < change + 40; ++i) step(balancer, i, faster);
  EXPECT_TRUE(within(balancer.shares(), ideal, 0.05))
      << balancer.shares()[0] << "," << balancer.shares()[1] << "," << balancer.shares()[2];
}

// A speed change gets its moves within a few steps and then the shares calm down again: no
// oscillation around the new balance.
TEST(LoadBalancer, ASpeedChangeIsFollowedAndThenTheSharesCalmDown) {
  LoadBalancer balancer(BalancerOptions{}, 3, kBatch);
  const std::vector<double> faster{1e-3, 2e-3, 2e-3};
  const std::vector<double> ideal{350, 175, 175};
  for (int64_t i = 0; i < 300; ++i) {
    step(balancer, i, i < 150 ? kPerSample : faster);
    if (i < 160) continue;
    EXPECT_TRUE(within(balancer.shares(), ideal, 0.03))
        << i << ": " << balancer.shares()[0] << "," << balancer.shares()[1] << ","
        << balancer.shares()[2];
  }
}

TEST(LoadBalancer, OffKeepsEqualShares) {
  BalancerOptions options;
  options.mode = BalancerMode::kOff;
  LoadBalancer balancer(options, 3, kBatch);
  for (int64_t i = 0; i < 50; ++i) EXPECT_FALSE(step(balancer, i, kPerSample));
  EXPECT_EQ(balancer.shares(), equalShares(kBatch, 3));
  EXPECT_EQ(balancer.lastChange(), "");
}

// A planner's shares are where the balancer starts: off keeps them, adaptive refines them to the
// measured speeds; shares that cannot be a split of the batch are refused.
TEST(LoadBalancer, StartsFromInitialSharesAndRefinesThem) {
  BalancerOptions options;
  options.initial_shares = {350, 250, 100};  // a plan that overrated rank 1
  options.mode = BalancerMode::kOff;
  LoadBalancer kept(options, 3, kBatch);
  for (int64_t i = 0; i < 30; ++i) EXPECT_FALSE(step(kept, i, kPerSample));
  EXPECT_EQ(kept.shares(), options.initial_shares);

  options.mode = BalancerMode::kAdaptive;
  LoadBalancer refined(options, 3, kBatch);
  EXPECT_EQ(refined.shares(), options.initial_shares);
  for (int64_t i = 0; i < 20; ++i) step(refined, i, kPerSample);
  EXPECT_TRUE(within(refined.shares(), kIdeal, 0.05))
      << refined.shares()[0] << "," << refined.shares()[1] << "," << refined.shares()[2];

  for (const std::vector<int64_t>& bad :
       {std::vector<int64_t>{350, 350}, {350, 250, 99}, {-1, 601, 100}}) {
    options.initial_shares = bad;
    EXPECT_THROW(LoadBalancer(options, 3, kBatch), ConfigError);
  }
  options.initial_shares = {400, 200, 100};
  EXPECT_THROW(LoadBalancer(options, 3, kBatch, {300, 0, 0}), ConfigError);  // above rank 0's cap
}

TEST(LoadBalancer, StaticChangesExactlyOnce) {
  BalancerOptions options;
  options.mode = BalancerMode::kStatic;
  LoadBalancer balancer(options, 3, kBatch);
  int changes = 0;
  for (int64_t i = 0; i < 30; ++i) changes += step(balancer, i, kPerSample);
  EXPECT_TRUE(within(balancer.shares(), kIdeal, 0.05));
  for (int64_t i = 30; i < 60; ++i) changes += step(balancer, i, {1e-3, 2e-3, 1e-3});
  EXPECT_EQ(changes, 1);
}

TEST(LoadBalancer, LogsEachChangeInOneLine) {
  LoadBalancer balancer(BalancerOptions{}, 3, kBatch);
  int64_t i = 0;
  while (!step(balancer, i, kPerSample)) ++i;
  EXPECT_EQ(i, 2);  // profile_steps = 3: the third update may rebalance
  const std::regex format(
      R"(step 2: shares 234,233,233 -> \d+,\d+,\d+: predicted step 0\.\d+ s -> 0\.\d+ s \(-\d+%\))");
  EXPECT_TRUE(std::regex_match(balancer.lastChange(), format)) << balancer.lastChange();
  EXPECT_LT(balancer.predictedStepSeconds(balancer.shares()),
            balancer.predictedStepSeconds(equalShares(kBatch, 3)));
}

TEST(LoadBalancer, RespectsCapsWhileBalancing) {
  LoadBalancer balancer(BalancerOptions{}, 3, kBatch, {300, 0, 0});
  for (int64_t i = 0; i < 40; ++i) step(balancer, i, kPerSample);
  EXPECT_EQ(balancer.shares()[0], 300);
  EXPECT_EQ(sum(balancer.shares()), kBatch);
  EXPECT_TRUE(within({balancer.shares()[1], balancer.shares()[2]}, {267, 133}, 0.05));
}

TEST(LoadBalancer, StateRoundTripsThroughExportAndImport) {
  LoadBalancer original(BalancerOptions{}, 3, kBatch);
  for (int64_t i = 0; i < 12; ++i) step(original, i, kPerSample);
  const BalancerState state = original.exportState();
  EXPECT_EQ(state.observation_rank.size(), 36u);

  LoadBalancer resumed(BalancerOptions{}, 3, kBatch);
  resumed.importState(state);
  EXPECT_EQ(resumed.shares(), original.shares());
  EXPECT_EQ(resumed.lastChange(), original.lastChange());
  const BalancerState again = resumed.exportState();
  EXPECT_EQ(again.observation_samples, state.observation_samples);
  EXPECT_EQ(again.observation_seconds, state.observation_seconds);
  EXPECT_EQ(again.last_change_step, state.last_change_step);
  EXPECT_EQ(again.steps_observed, state.steps_observed);
  // From here on both make the same decisions, through a speed change.
  for (int64_t i = 12; i < 50; ++i) {
    const std::vector<double>& speeds = i < 25 ? kPerSample : std::vector<double>{1e-3, 2e-3, 2e-3};
    EXPECT_EQ(step(original, i, speeds), step(resumed, i, speeds));
    EXPECT_EQ(original.shares(), resumed.shares());
  }

  BalancerState broken = state;
  broken.shares[0] += 1;
  EXPECT_THROW(resumed.importState(broken), CheckpointError);
  broken = state;
  broken.observation_rank[0] = 7;
  EXPECT_THROW(resumed.importState(broken), CheckpointError);
  LoadBalancer other_world(BalancerOptions{}, 2, kBatch);
  EXPECT_THROW(other_world.importState(state), CheckpointError);
}

// A state exported while a rank's slow step is held back (hiccup or change of speed?) resumes
// that judgement exactly: the held observation and the remembered fixed costs travel with it.
TEST(LoadBalancer, StateCarriesHeldObservationsAndFixedCosts) {
  const std::vector<double> fixed_cost{0.05, 0.02, 0.01};
  const auto feed = [&](LoadBalancer& balancer, int64_t index, double slow) {
    std::vector<double> seconds;
    for (size_t i = 0; i < 3; ++i)
      seconds.push_back((fixed_cost[i] + balancer.shares()[i] * kPerSample[i]) *
                        (i == 2 ? slow : 1.0) * (1.0 + 0.01 * noise(index, static_cast<int>(i))));
    return balancer.update(index, seconds);
  };
  LoadBalancer original(BalancerOptions{}, 3, kBatch);
  for (int64_t i = 0; i < 30; ++i) feed(original, i, 1.0);
  feed(original, 30, 2.0);  // rank 2 slows down: held back
  const BalancerState state = original.exportState();
  EXPECT_EQ(state.held_rank, std::vector<int>{2});
  ASSERT_EQ(state.fixed_seconds.size(), 3u);
  EXPECT_GT(state.fixed_seconds[0], 0.0);

  LoadBalancer resumed(BalancerOptions{}, 3, kBatch);
  resumed.importState(state);
  // Rank 2 stays slow: both confirm the change at the same step and move alike.
  for (int64_t i = 31; i < 50; ++i) {
    EXPECT_EQ(feed(original, i, 2.0), feed(resumed, i, 2.0)) << i;
    EXPECT_EQ(original.shares(), resumed.shares()) << i;
  }
  BalancerState broken = state;
  broken.held_ratio.clear();
  EXPECT_THROW(resumed.importState(broken), CheckpointError);
}

// A move the fits keep calling for but that lies within the noise margin is counted over updates
// (BalancerState::small_gain_updates); a state exported mid-count resumes the count exactly.
TEST(LoadBalancer, StateCarriesAMoveWithinTheNoiseBeingCounted) {
  const std::vector<double> per_sample{1.35e-3, 9.5e-3};
  const auto feed = [&](LoadBalancer& balancer, int64_t index) {
    std::vector<double> seconds;
    for (size_t i = 0; i < 2; ++i)
      seconds.push_back(balancer.shares()[i] * per_sample[i] *
                        (1.0 + 0.15 * noise(index, static_cast<int>(i))));
    return balancer.update(index, seconds);
  };
  BalancerOptions options;
  options.initial_shares = {174, 18};
  LoadBalancer original(options, 2, 192);
  int64_t index = 0;
  while (original.exportState().small_gain_updates == 0 && index < 200) feed(original, index++);
  const BalancerState state = original.exportState();
  ASSERT_GT(state.small_gain_updates, 0) << "no move within the noise was ever counted";
  EXPECT_EQ(state.small_gain_direction, (std::vector<int>{-1, 1}));

  LoadBalancer resumed(options, 2, 192);
  resumed.importState(state);
  bool moved = false;
  for (int64_t i = index; i < index + 40; ++i) {
    const bool changed = feed(original, i);
    EXPECT_EQ(changed, feed(resumed, i)) << i;
    EXPECT_EQ(original.shares(), resumed.shares()) << i;
    moved = moved || changed;
  }
  EXPECT_TRUE(moved);
  BalancerState broken = state;
  broken.small_gain_direction = {1, 0, -1};
  EXPECT_THROW(resumed.importState(broken), CheckpointError);
}

TEST(LoadBalancer, ParsesModesAndRejectsBadOptions) {
  EXPECT_EQ(LoadBalancer::parseMode("off"), BalancerMode::kOff);
  EXPECT_EQ(LoadBalancer::parseMode("static"), BalancerMode::kStatic);
  EXPECT_EQ(LoadBalancer::parseMode("adaptive"), BalancerMode::kAdaptive);
  EXPECT_THROW(LoadBalancer::parseMode("Adaptive"), ConfigError);
  EXPECT_THROW(LoadBalancer(BalancerOptions{}, 0, 10), ConfigError);
  EXPECT_THROW(LoadBalancer(BalancerOptions{}, 2, 10, {3, 3}), ConfigError);
  BalancerOptions bad;
  bad.min_gain = 1.0;
  EXPECT_THROW(LoadBalancer(bad, 2, 10), ConfigError);
  bad = BalancerOptions{};
  bad.window = 1;
  EXPECT_THROW(LoadBalancer(bad, 2, 10), ConfigError);
  LoadBalancer balancer(BalancerOptions{}, 2, 10);
  EXPECT_THROW(balancer.update(0, {1.0}), ConfigError);
}

}  // namespace
}  // namespace chorus::plan
