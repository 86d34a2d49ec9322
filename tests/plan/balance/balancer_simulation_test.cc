// The real LoadBalancer on simulated devices (tests/plan/simulated_cluster.h): hundreds of random
// device mixes, each run step by step against the optimum of its true cost curves, with no wall
// clock. These are the balancer's claims (issue 14):
//   - converged: from 10 steps after profiling, every step within 3% of the optimum (1% jitter);
//   - through 3% jitter, rare 3× hiccups and pairs of devices that share cores: the steady state
//     within 5% of the optimum;
//   - a change of speed followed within 5 steps; a device that becomes memory-capped at once;
//   - a single slow step moves nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>

#include "chorus/plan/balancer.h"
#include "plan/simulated_cluster.h"

namespace chorus::plan {
namespace {

using testing::NoiseModel;
using testing::PortableRandom;
using testing::SimDevice;

constexpr int kMixes = 200;
const int kProfileSteps = BalancerOptions{}.profile_steps;
// Steps after profiling by which the balancer must have converged.
constexpr int kConvergeSteps = 10;
constexpr int kSteps = 60;

struct Mix {
  std::vector<SimDevice> devices;
  std::int64_t batch = 0;
  std::string describe() const {
    std::string text = "B = " + std::to_string(batch) + ", devices (a ms, c ms):";
    for (const SimDevice& device : devices) {
      char item[64];
      std::snprintf(item, sizeof item, " (%.3g, %.3g)", 1e3 * device.a, 1e3 * device.c);
      text += item;
    }
    return text;
  }
};

// 2-64 devices of speeds 0.02-1 (log-uniform), B from 16 to 8192 (log-uniform, at least one
// sample per device), each device's fixed cost up to 30% of the balanced step.
Mix randomMix(PortableRandom& random) {
  Mix mix;
  const int devices = static_cast<int>(std::round(random.logUniform(2, 64)));
  mix.batch =
      static_cast<std::int64_t>(std::round(random.logUniform(std::max(16, 2 * devices), 8192)));
  constexpr double kFastestPerSample = 1e-3;
  std::vector<double> speeds;
  for (int i = 0; i < devices; ++i) speeds.push_back(random.logUniform(0.02, 1.0));
  const double speed_sum = std::accumulate(speeds.begin(), speeds.end(), 0.0);
  const double step = kFastestPerSample * static_cast<double>(mix.batch) / speed_sum;
  for (double speed : speeds)
    mix.devices.push_back({random.uniform(0, 0.3) * step, kFastestPerSample / speed, 0});
  return mix;
}

struct SimRun {
  std::vector<double> ratio;  // true step time / optimum, per step
  std::vector<std::vector<std::int64_t>> shares;
  int changesAfter(int step) const {
    int changes = 0;
    for (size_t s = std::max(1, step); s < shares.size(); ++s)
      changes += shares[s] != shares[s - 1];
    return changes;
  }
  double worstFrom(int step) const { return *std::max_element(ratio.begin() + step, ratio.end()); }
  double meanFrom(int step) const {
    return std::accumulate(ratio.begin() + step, ratio.end(), 0.0) /
           static_cast<double>(ratio.size() - step);
  }
};

// Runs the balancer for `steps` steps; `change(step, devices, shares)` may alter the devices
// (speed, caps) before a step that would run at `shares`, and returns true when it did (the caps
// then reach the balancer and the optimum is computed again).
template <typename Change>
SimRun simulate(const Mix& mix, const NoiseModel& noise, std::uint64_t seed, int steps,
                Change change) {
  std::vector<SimDevice> devices = mix.devices;
  LoadBalancer balancer(BalancerOptions{}, static_cast<int>(devices.size()), mix.batch);
  PortableRandom random(seed);
  double optimum = testing::optimumStepSeconds(devices, mix.batch, noise);
  SimRun run;
  for (int step = 0; step < steps; ++step) {
    if (change(step, devices, balancer.shares())) {
      std::vector<std::int64_t> caps;
      for (const SimDevice& device : devices) caps.push_back(device.cap);
      balancer.setCaps(caps);
      optimum = testing::optimumStepSeconds(devices, mix.batch, noise);
    }
    const std::vector<std::int64_t> shares = balancer.shares();
    run.shares.push_back(shares);
    run.ratio.push_back(testing::trueStepSeconds(devices, shares, noise) / optimum);
    balancer.update(step, testing::measuredSeconds(devices, shares, noise, random));
  }
  return run;
}

SimRun simulate(const Mix& mix, const NoiseModel& noise, std::uint64_t seed, int steps) {
  return simulate(
      mix, noise, seed, steps,
      [](int, std::vector<SimDevice>&, const std::vector<std::int64_t>&) { return false; });
}

double median(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

void report(const char* name, const std::vector<double>& worst) {
  std::printf("%s over %zu mixes: worst step / optimum median %.4f, max %.4f\n", name, worst.size(),
              median(worst), *std::max_element(worst.begin(), worst.end()));
}

TEST(BalancerSimulation, ConvergesWithinThreePercentOfTheOptimumOnEveryMix) {
  PortableRandom draw(14);
  NoiseModel noise;
  noise.jitter = 0.01;
  std::vector<double> worst;
  for (int m = 0; m < kMixes; ++m) {
    const Mix mix = randomMix(draw);
    const SimRun run = simulate(mix, noise, 1000 + m, kSteps);
    worst.push_back(run.worstFrom(kProfileSteps + kConvergeSteps));
    EXPECT_LE(worst.back(), 1.03) << "mix " << m << ": " << mix.describe();
    // No oscillation: what moves there is left in the second half are small corrections (0-3 in
    // 30 steps at 1% jitter, seed 14).
    EXPECT_LE(run.changesAfter(kSteps / 2), 5) << "mix " << m << ": " << mix.describe();
  }
  report("1% jitter, from step 13", worst);
}

TEST(BalancerSimulation, StaysNearTheOptimumThroughNoiseHiccupsAndSharedCores) {
  PortableRandom draw(15);
  std::vector<double> worst_mean, worst_step;
  for (int m = 0; m < kMixes; ++m) {
    const Mix mix = randomMix(draw);
    NoiseModel noise;
    noise.jitter = 0.03;
    noise.spike_probability = 0.01;
    const int n = static_cast<int>(mix.devices.size());
    // Up to two pairs of devices share cores.
    for (int pair = 0; pair < std::min(2, n / 2); ++pair)
      noise.shared_cores.push_back({2 * pair, 2 * pair + 1});
    const SimRun run = simulate(mix, noise, 2000 + m, kSteps);
    worst_mean.push_back(run.meanFrom(kProfileSteps + kConvergeSteps));
    worst_step.push_back(run.worstFrom(kProfileSteps + kConvergeSteps));
    EXPECT_LE(worst_mean.back(), 1.05) << "mix " << m << ": " << mix.describe();
  }
  report("3% jitter, 1% hiccups, shared cores: mean from step 13", worst_mean);
  report("3% jitter, 1% hiccups, shared cores: worst from step 13", worst_step);
}

// A device slows down or speeds up (x0.33-0.67 or x1.5-3) at step 30: within 5 steps the step is
// again within 5% of the new optimum (1% jitter), within 10 steps within 3%.
TEST(BalancerSimulation, FollowsASpeedChangeWithinFiveSteps) {
  PortableRandom draw(16);
  NoiseModel noise;
  noise.jitter = 0.01;
  constexpr int kChange = 30;
  std::vector<double> worst, late;
  for (int m = 0; m < kMixes; ++m) {
    const Mix mix = randomMix(draw);
    const int changed = static_cast<int>(draw.integer(0, mix.devices.size() - 1));
    const double factor = draw.uniform() < 0.5 ? draw.uniform(1.5, 3.0) : draw.uniform(0.33, 0.67);
    const SimRun run = simulate(
        mix, noise, 3000 + m, kSteps,
        [&](int step, std::vector<SimDevice>& devices, const std::vector<std::int64_t>& shares) {
          if (step != kChange) return false;
          devices[changed].a *= factor;
          devices[changed].c *= factor;
          return true;
        });
    worst.push_back(run.worstFrom(kChange + 5));
    EXPECT_LE(worst.back(), 1.05) << "mix " << m << ", device " << changed << " x" << factor << ": "
                                  << mix.describe();
    late.push_back(run.worstFrom(kChange + 10));
    EXPECT_LE(late.back(), 1.03) << "mix " << m << ", device " << changed << " x" << factor << ": "
                                 << mix.describe();
  }
  report("speed change at step 30, from step 35", worst);
  report("speed change at step 30, from step 40", late);
}

// At step 30 a device can hold only half its share (a memory cap): the next step respects the
// cap, and within 5 steps the step is within 3% of the new optimum.
TEST(BalancerSimulation, RespectsACapThatAppearsMidRun) {
  PortableRandom draw(17);
  NoiseModel noise;
  noise.jitter = 0.01;
  constexpr int kChange = 30;
  std::vector<double> worst;
  for (int m = 0; m < kMixes; ++m) {
    const Mix mix = randomMix(draw);
    const int capped = static_cast<int>(draw.integer(0, mix.devices.size() - 1));
    std::int64_t cap = 0;
    const SimRun run = simulate(
        mix, noise, 4000 + m, kSteps,
        [&](int step, std::vector<SimDevice>& devices, const std::vector<std::int64_t>& shares) {
          if (step != kChange) return false;
          cap = std::max<std::int64_t>(1, shares[capped] / 2);
          devices[capped].cap = cap;
          return true;
        });
    for (int step = kChange; step < kSteps; ++step) ASSERT_LE(run.shares[step][capped], cap);
    worst.push_back(run.worstFrom(kChange + 5));
    EXPECT_LE(worst.back(), 1.03) << "mix " << m << ", device " << capped << " capped at " << cap
                                  << ": " << mix.describe();
  }
  report("cap at step 30, from step 35", worst);
}

// A single slow step (3x, a host hiccup) on any one device of a balanced run moves nothing, and
// neither does one on every device at once. Without jitter, so that any move is the hiccup's.
// A fast device and one 7x slower, both measured with 10% noise (what an emulated device at 0.077
// of a core measured on a shared host: 204-324 ms at one share), started 5 samples off the
// balance (where that run stayed): the 3% the move would gain lies inside the noise margin (two
// standard errors of the noisiest fit), so no single look justifies it. The fits keep calling for
// it, though, and the balancer takes it in damped steps. Without that (the margin alone) the
// median over the seeds stays 1.6% off the optimum and the worst 3.0%.
TEST(BalancerSimulation, AGainWithinTheNoiseIsTakenWhenTheFitsKeepCallingForIt) {
  const Mix mix{{{0.0, 1.35e-3, 0}, {0.0, 9.5e-3, 0}}, 192};
  NoiseModel noise;
  noise.jitter = 0.10;
  std::vector<double> steady;
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    BalancerOptions options;
    options.initial_shares = {174, 18};
    LoadBalancer balancer(options, 2, mix.batch);
    PortableRandom random(7000 + seed);
    const double optimum = testing::optimumStepSeconds(mix.devices, mix.batch, noise);
    double sum = 0;
    int counted = 0;
    for (int step = 0; step < 100; ++step) {
      const std::vector<std::int64_t> shares = balancer.shares();
      if (step >= 60) {
        sum += testing::trueStepSeconds(mix.devices, shares, noise) / optimum;
        ++counted;
      }
      balancer.update(step, testing::measuredSeconds(mix.devices, shares, noise, random));
    }
    steady.push_back(sum / counted);
    EXPECT_LE(steady.back(), 1.03)
        << "seed " << seed << ": shares " << balancer.shares()[0] << "," << balancer.shares()[1];
  }
  EXPECT_LE(median(steady), 1.01);
  report("7x slower device, 10% noise, started 5 samples off: mean from step 60", steady);
}

TEST(BalancerSimulation, ASingleSlowStepMovesNothing) {
  PortableRandom draw(18);
  const NoiseModel noise;
  for (int m = 0; m < 50; ++m) {
    const Mix mix = randomMix(draw);
    const int n = static_cast<int>(mix.devices.size());
    LoadBalancer balancer(BalancerOptions{}, n, mix.batch);
    PortableRandom random(5000 + m);
    const auto run = [&](int step, int slow) {  // slow: a device, n for all, -1 for none
      std::vector<double> seconds =
          testing::measuredSeconds(mix.devices, balancer.shares(), noise, random);
      for (int i = 0; i < n; ++i)
        if (slow == i || slow == n) seconds[i] *= 3;
      return balancer.update(step, seconds);
    };
    int step = 0;
    for (; step < 40; ++step) run(step, -1);
    for (int slow = 0; slow <= n; ++slow) {
      const std::vector<std::int64_t> before = balancer.shares();
      EXPECT_FALSE(run(step++, slow))
          << "mix " << m << ", slow " << slow << ": " << balancer.lastChange();
      for (int quiet = 0; quiet < 3; ++quiet) EXPECT_FALSE(run(step++, -1));
      EXPECT_EQ(balancer.shares(), before);
    }
  }
}

}  // namespace
}  // namespace chorus::plan
