// A rank whose one sample would make it the straggler is left out (share 0), said so in the log,
// and brought back when the others slow down (LoadBalancer, BalancerOptions::leave_out).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "chorus/plan/balancer.h"

namespace chorus::plan {
namespace {

// A simulated device: t(b) = (fixed + per_sample · b) / speed for b > 0, nothing for b = 0.
struct Device {
  double fixed;
  double per_sample;
  double speed;
  double seconds(int64_t samples) const {
    return samples > 0 ? (fixed + per_sample * static_cast<double>(samples)) / speed : 0.0;
  }
};

// Runs one step of `devices` at the balancer's shares and feeds it the times; returns whether
// the shares changed.
bool runStep(LoadBalancer& balancer, int64_t step, const std::vector<Device>& devices) {
  std::vector<double> seconds;
  for (size_t i = 0; i < devices.size(); ++i)
    seconds.push_back(devices[i].seconds(balancer.shares()[i]));
  return balancer.update(step, seconds);
}

// The shape of the case: a fast device with 96 samples in ~25 ms beside one at 1/100 of
// its speed, whose single sample (its fixed cost included) takes ~110 ms.
const Device kFast{1e-3, 0.25e-3, 1.0};
const Device kSlow{1e-3, 0.1e-3, 0.01};
constexpr int64_t kBatch = 96;

BalancerOptions namedOptions() {
  BalancerOptions options;
  options.rank_names = {"cpu@1.0", "cpu@0.01"};
  return options;
}

TEST(LoadBalancerLeaveOut, ARankWhoseOneSampleIsTheStragglerIsLeftOutAndSaysWhy) {
  BalancerOptions options = namedOptions();
  options.initial_shares = proportionalShares(kBatch, {1.0, 0.01});
  LoadBalancer balancer(options, 2, kBatch);
  ASSERT_EQ(balancer.shares(), (std::vector<int64_t>{95, 1}));
  std::string change;
  for (int64_t step = 0; step < 6; ++step)
    if (runStep(balancer, step, {kFast, kSlow})) change = balancer.lastChange();
  EXPECT_EQ(balancer.shares(), (std::vector<int64_t>{96, 0}));
  EXPECT_NE(change.find("cpu@0.01 left out: its one sample takes 110 ms against the step's 25 ms"),
            std::string::npos)
      << change;
  // It stays out while nothing changes.
  for (int64_t step = 6; step < 60; ++step) EXPECT_FALSE(runStep(balancer, step, {kFast, kSlow}));
}

TEST(LoadBalancerLeaveOut, ALeftOutRankComesBackWhenTheOthersSlowDown) {
  BalancerOptions options = namedOptions();
  options.initial_shares = {95, 1};
  LoadBalancer balancer(options, 2, kBatch);
  int64_t step = 0;
  for (; step < 10; ++step) runStep(balancer, step, {kFast, kSlow});
  ASSERT_EQ(balancer.shares()[1], 0);
  // The fast device slows to a tenth: 96 samples now take ~250 ms, the slow one's sample 110 ms.
  const Device throttled{kFast.fixed, kFast.per_sample, 0.1};
  std::string changes;
  for (const int64_t end = step + 30; step < end; ++step)
    if (runStep(balancer, step, {throttled, kSlow})) changes += balancer.lastChange() + "\n";
  EXPECT_NE(changes.find("cpu@0.01 back in"), std::string::npos) << changes;
  // Measured at more than one share again, it is balanced to the optimum of both devices:
  // 100 + 10 b ms against 10 + 2.5 (96 - b) ms, equal at b = 12 (220 ms against 250 ms alone).
  const std::vector<RankTiming> truth{{10e-3, 2.5e-3}, {100e-3, 10e-3}};
  ASSERT_EQ(balanceShares(truth, kBatch), (std::vector<int64_t>{84, 12}));
  EXPECT_NEAR(balancer.shares()[1], 12, 1) << changes;
  EXPECT_LE(predictedStepSeconds(truth, balancer.shares()), 1.02 * 0.220) << changes;
}

TEST(LoadBalancerLeaveOut, ARankIsKeptWhenItsOneSampleFitsTheStep) {
  // The slow device's sample (~11 ms) fits the fast one's step (~25 ms): it keeps its share.
  const Device slow{1e-3, 0.1e-3, 0.1};
  LoadBalancer balancer(namedOptions(), 2, kBatch);
  for (int64_t step = 0; step < 40; ++step) runStep(balancer, step, {kFast, slow});
  EXPECT_GT(balancer.shares()[1], 0);
}

TEST(LoadBalancerLeaveOut, OffKeepsEveryRankIn) {
  BalancerOptions options = namedOptions();
  options.leave_out = false;
  options.initial_shares = {95, 1};
  LoadBalancer balancer(options, 2, kBatch);
  for (int64_t step = 0; step < 40; ++step) runStep(balancer, step, {kFast, kSlow});
  EXPECT_EQ(balancer.shares(), (std::vector<int64_t>{95, 1}));
}

TEST(LoadBalancerLeaveOut, ARankNeverMeasuredIsNeverLeftOut) {
  // Rank 2 starts at zero and has no measurements: it borrows the others' mean fit and is
  // given samples, never left out on no evidence.
  BalancerOptions options;
  options.initial_shares = {48, 48, 0};
  LoadBalancer balancer(options, 3, kBatch);
  for (int64_t step = 0; step < 4; ++step) runStep(balancer, step, {kFast, kFast, kFast});
  EXPECT_GT(balancer.shares()[2], 0);
}

}  // namespace
}  // namespace chorus::plan
