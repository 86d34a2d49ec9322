// The load balancer in a real training run: ranks with emulated speeds as threads over one
// in-memory store (sleep padding works the same in threads and processes).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "chorus/comm/store/memory_store.h"
#include "chorus/core/config.h"
#include "chorus/device/discovery.h"
#include "chorus/device/host_sharing.h"
#include "chorus/device/speed_emulator.h"
#include "chorus/runtime/job/job_config.h"
#include "chorus/runtime/train/trainer.h"
#include "runtime/job_fixtures.h"
#include "runtime/trainer_threads.h"

namespace chorus::runtime {
namespace {

// B = 192: at 384 the fastest rank's share (~220 samples) held ~23 MB of activations per layer,
// past what the shared L3 keeps for it once the other workers run, and its time per sample jumped
// ~50% in blocks of steps; a linear fit cannot follow such a cliff and the shares swung 9% of B
// (2026-11-30: 40% of runs failed at 384, none of 8 at 192).
const std::string kJob =
    testing::jobStart({.seed = 1, .balance = "adaptive"},
                      {.steps = 45, .global_batch = 192, .eval_every = 0, .eval_samples = 96}) +
    R"([model]
kind = "cnn"
channels = 32
blocks = 2
groups = 8
input_shape = [1, 28, 28]
)" + testing::syntheticData(4096) +
    testing::optimizerTable({.lr = 0.01});

// Runs the job on threads; `speed_of(rank, step)` is each rank's emulated speed, `offsets` their
// turns on the host's cores as `chorus run` would give them (empty: none). Returns the shares of
// every step (as rank 0 saw them; all ranks agree by construction).
std::vector<std::vector<std::int64_t>> sharesOverRun(
    int world, const std::function<double(int, std::int64_t)>& speed_of,
    std::vector<std::vector<double>>* compute = nullptr, const std::vector<double>& offsets = {}) {
  auto store = std::make_shared<comm::MemoryStore>();
  std::vector<std::vector<std::int64_t>> shares;
  const auto errors = testing::runRankThreads(world, [&](int rank) {
    const JobConfig job = readJobConfig(Config::parseString(kJob));
    InitOptions options = testing::threadRankOptions(rank, world, store);
    if (!offsets.empty())
      options.environment->emplace("CHORUS_EMULATION_OFFSET", std::to_string(offsets[rank]));
    Trainer trainer(job, init(options));
    TrainerHooks hooks;
    hooks.speed_at = [&, rank](std::int64_t step) { return speed_of(rank, step); };
    hooks.on_step = [&, rank](const StepRecord& record) {
      if (rank == 0) shares.push_back(record.shares);
      if (rank == 0 && compute) compute->push_back(record.compute_seconds);
      if (rank == 0 && !record.rebalance.empty()) std::printf("%s\n", record.rebalance.c_str());
      if (rank == 0 && std::getenv("CHORUS_TEST_VERBOSE")) {
        for (size_t i = 0; i < record.shares.size(); ++i)
          std::printf("%6.2f ", 1e3 * record.compute_seconds[i] / record.shares[i]);
        std::printf(" ms/sample\n");
      }
    };
    trainer.run(hooks);
  });
  for (int rank = 0; rank < world; ++rank) EXPECT_EQ(errors[rank], "") << "rank " << rank;
  return shares;
}

// The speeds of the balancer tests are the nominal {1.0, 0.5, 0.25} scaled by this factor: the same
// 4:2:1 ratios, at half the host load. Three workers on two vCPUs at full load slow each other's
// compute by 10-25% in amounts that depend on the shares themselves (docs/performance.md), and
// the balancer would chase that.
constexpr double kScale = 0.5;

std::string describe(const std::vector<std::vector<std::int64_t>>& shares) {
  std::ostringstream text;
  for (size_t step = 0; step < shares.size(); ++step) {
    text << step << ":";
    for (auto share : shares[step]) text << " " << share;
    text << "\n";
  }
  return text.str();
}

// What these tests claim holds on a noisy host without running anything twice: the ordering of
// the shares, and medians over many steps (a slowdown of the host for fewer than half of them
// moves no median). How close the balancer gets to the optimum, how fast, and how still it stays
// are claims about the policy, tested deterministically on simulated devices
// (tests/plan/balancer_simulation_test.cc); three emulated workers on two shared vCPUs only hold
// their nominal speeds approximately (docs/performance.md).

// The median over steps [first, end) of `value(step)`.
double medianOver(size_t first, size_t end, const std::function<double(size_t)>& value) {
  std::vector<double> values;
  for (size_t step = first; step < end; ++step) values.push_back(value(step));
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

TEST(BalancerMultiproc, SharesFollowEmulatedSpeeds) {
  const std::vector<double> speeds{kScale * 1.0, kScale * 0.5, kScale * 0.25};
  std::vector<std::vector<double>> compute;
  // Three workers on this host's cores take turns, as under `chorus run`.
  const auto offsets = device::staggerOffsets(speeds, device::discoverDevices().front().cores);
  const auto shares = sharesOverRun(
      3, [&](int rank, std::int64_t) { return speeds[rank]; }, &compute, offsets);
  ASSERT_EQ(shares.size(), 45u);
  // The first fit already orders the ranks by speed. It comes after 3 profiling steps on a quiet
  // host, later when the host is busy enough that the profiles disagree (another 3-worker job
  // beside this one under ctest -j2 took it to step 10): when is the policy's, tested on
  // simulated devices; the order it finds is what holds here.
  size_t first_fit = 1;
  while (first_fit < 22 && shares[first_fit] == shares[0]) ++first_fit;
  ASSERT_LT(first_fit, 22u) << "no fit before step 22\n" << describe(shares);
  EXPECT_GT(shares[first_fit][0], shares[first_fit][1]) << describe(shares);
  EXPECT_GT(shares[first_fit][1], shares[first_fit][2]) << describe(shares);
  // From step 22 on: the ranks finish close together (an equal split: the slowest takes ~4x the
  // fastest), and each rank's median share is near the nominal 4:2:1 (measured 0.4-3.9% of B on
  // a quiet host; twice the old 5% target, which a noisy host missed now and then).
  const auto computeOf = [&](size_t rank) {
    return medianOver(22, shares.size(), [&](size_t step) { return compute[step][rank]; });
  };
  const double spread = std::max({computeOf(0), computeOf(1), computeOf(2)}) /
                        std::min({computeOf(0), computeOf(1), computeOf(2)});
  std::printf("steps 22-44: median compute of the slowest / fastest rank %.2f\n", spread);
  EXPECT_LE(spread, 2.0) << describe(shares);
  const std::vector<double> nominal{4.0 / 7, 2.0 / 7, 1.0 / 7};
  for (size_t rank = 0; rank < 3; ++rank) {
    const double share = medianOver(22, shares.size(), [&](size_t step) {
      return static_cast<double>(shares[step][rank]) / 192.0;
    });
    std::printf("rank %zu: median share %.3f of B (nominal %.3f)\n", rank, share, nominal[rank]);
    EXPECT_NEAR(share, nominal[rank], 0.10) << describe(shares);
  }
}

TEST(BalancerMultiproc, ARankWhoseSpeedChangesGetsANewShare) {
  // Rank 1 drops to a third of its speed at step 20: 1:1, then 3:1.
  const auto shares = sharesOverRun(2, [](int rank, std::int64_t step) {
    return kScale * (rank == 1 && step >= 20 ? 1.0 / 3 : 1.0);
  });
  ASSERT_EQ(shares.size(), 45u);
  const auto medianShareOfRank1 = [&](size_t first, size_t end) {
    return medianOver(first, end,
                      [&](size_t step) { return static_cast<double>(shares[step][1]) / 192.0; });
  };
  // Before the change both ranks run at the same speed: near an even split.
  EXPECT_NEAR(medianShareOfRank1(8, 20), 0.5, 0.10) << describe(shares);
  // After it, near 3:1 (an even split would be 0.5).
  EXPECT_NEAR(medianShareOfRank1(30, shares.size()), 0.25, 0.10) << describe(shares);
}

}  // namespace
}  // namespace chorus::runtime
