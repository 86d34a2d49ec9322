// The adaptive cut's decisions (parallel::RecutPolicy) on synthetic measurements: a model of six
// layers of equal work, two stages, and compute times made from each layer's true cost and each
// device's true speed, so every decision below is exact and needs no process.
#include "chorus/parallel/pipeline_recut.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "chorus/core/error.h"

namespace chorus::parallel {
namespace {

constexpr int kLayers = 6;
constexpr int kMicroBatches = 4;
constexpr std::int64_t kBatch = 16;

std::vector<model::LayerProfile> equalLayers() {
  std::vector<model::LayerProfile> profile(kLayers);
  for (int l = 0; l < kLayers; ++l) {
    profile[l].name = "layer" + std::to_string(l);
    profile[l].forward_flops = 1e6;
    profile[l].parameters = 1000 * (l + 1);
    profile[l].activation_bytes = 4096;
  }
  return profile;
}

std::shared_ptr<const plan::MemoryModel> memoryOf(const std::vector<model::LayerProfile>& profile) {
  plan::ModelProfile model;
  model.name = "synthetic";
  model.activation_element_bytes = 4;
  for (const model::LayerProfile& layer : profile) {
    const double output = static_cast<double>(layer.activation_bytes);
    model.layers.push_back({layer.name, static_cast<double>(layer.parameters), layer.forward_flops,
                            24 * output, output});
  }
  return std::make_shared<const plan::MemoryModel>(model, plan::MemoryOptions{8});
}

CutRequest twoStages(std::uint64_t stage0_budget = 0) {
  CutRequest request;
  request.profile = equalLayers();
  request.memory = memoryOf(request.profile);
  request.options.pipeline_stages = 2;
  request.options.micro_batches = kMicroBatches;
  request.options.global_batch = kBatch;
  request.devices = {{{1.0, stage0_budget}, {1.0, 0}}};
  return request;
}

// A pipeline whose layers truly cost `cost[l]` (relative to the profile's) on devices of true
// speeds `speed[s]`: the compute seconds of each stage and the step time, as the trainer measures.
struct Simulated {
  std::vector<double> cost = std::vector<double>(kLayers, 1.0);
  std::vector<double> speed = {1.0, 1.0};
  // Multiplies each stage's time by (1 + noise · u), u uniform in [-1, 1] from a fixed sequence.
  double noise = 0;
  std::uint64_t state = 12345;

  double uniform() {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(state >> 11) / static_cast<double>(1ULL << 53) * 2 - 1;
  }
  std::vector<double> computeSeconds(const std::vector<int>& cuts) {
    std::vector<double> seconds;
    for (int s = 0; s < 2; ++s) {
      double work = 0;
      for (int l = cuts[s]; l < cuts[s + 1]; ++l) work += cost[l];
      seconds.push_back(0.01 * work / speed[s] * (1 + noise * uniform()));
    }
    return seconds;
  }
  static double stepSeconds(const std::vector<double>& compute) {
    const double slowest = std::max(compute[0], compute[1]) / kMicroBatches;
    return (compute[0] + compute[1]) / kMicroBatches + (kMicroBatches - 1) * slowest;
  }
};

// Runs `steps` steps from `cuts`, applying the policy's moves; `change(step, sim)` may alter the
// simulation before each step. Returns the moves made.
template <typename Change>
std::vector<RecutMove> run(RecutPolicy& policy, Simulated& sim, int steps, Change change) {
  std::vector<RecutMove> moves;
  for (int step = 0; step < steps; ++step) {
    change(step, sim);
    const std::vector<double> compute = sim.computeSeconds(policy.cuts());
    const auto move = policy.update(step, compute, {kBatch}, Simulated::stepSeconds(compute));
    if (move) {
      moves.push_back(*move);
      policy.moved(*move);
    }
  }
  return moves;
}

TEST(RecutPolicy, AStageSlowingToHalfSpeedGivesLayersToItsNeighbour) {
  RecutPolicy policy(twoStages(), {0, 3, 6}, RecutOptions{});
  Simulated sim;
  const auto moves = run(policy, sim, 60, [](int step, Simulated& s) {
    if (step == 30) s.speed[1] = 0.5;
  });
  ASSERT_EQ(moves.size(), 1u);
  // The drift is seen once the median of the window of 5 holds slow steps: 3 of them.
  EXPECT_GE(moves[0].step, 32);
  EXPECT_LE(moves[0].step, 34);
  EXPECT_EQ(moves[0].to, (std::vector<int>{0, 4, 6}));  // 4 : 2 layers for speeds 1 : 0.5
  EXPECT_NEAR(moves[0].speeds[1], 0.5, 1e-9);
  // 3 + 6 + 3 · 6 = 27 units against 4 + 4 + 3 · 4 = 20.
  EXPECT_NEAR(moves[0].predictedGain(), 7.0 / 27.0, 1e-9);
  EXPECT_EQ(policy.cuts(), (std::vector<int>{0, 4, 6}));
}

TEST(RecutPolicy, ReportsTheMeasuredGainOneWindowAfterAMove) {
  RecutPolicy policy(twoStages(), {0, 3, 6}, RecutOptions{});
  Simulated sim;
  std::vector<std::string> reports;
  for (int step = 0; step < 60; ++step) {
    if (step == 30) sim.speed[1] = 0.5;
    const std::vector<double> compute = sim.computeSeconds(policy.cuts());
    const auto move = policy.update(step, compute, {kBatch}, Simulated::stepSeconds(compute));
    const std::string report = policy.takeMeasuredGain();
    if (!report.empty()) reports.push_back(report);
    if (move) policy.moved(*move);
  }
  ASSERT_EQ(reports.size(), 1u);
  // The window before the move held 3 slow steps of 5: its median is the slow cut's time.
  EXPECT_NE(reports[0].find("cut 3+3 -> 4+2"), std::string::npos) << reports[0];
  EXPECT_NE(reports[0].find("gain 26%; predicted 26%"), std::string::npos) << reports[0];
}

TEST(RecutPolicy, NoiseUnderTheThresholdMovesNothing) {
  RecutPolicy policy(twoStages(), {0, 3, 6}, RecutOptions{});
  Simulated sim;
  sim.noise = 0.10;  // each step ±10%, far above the 5% threshold per step; medians stay closer
  EXPECT_TRUE(run(policy, sim, 400, [](int, Simulated&) {}).empty());
  // A small real difference is not worth a layer either: 3 + 3 stays best at speeds 1 : 0.9.
  RecutPolicy slower(twoStages(), {0, 3, 6}, RecutOptions{});
  Simulated slight;
  slight.speed[1] = 0.9;
  EXPECT_TRUE(run(slower, slight, 200, [](int, Simulated&) {}).empty());
}

TEST(RecutPolicy, RespectsTheMemoryBudgets) {
  // Stage 0 fits at most 4 layers; its neighbour slows to 0.2, for which 5 + 1 would be best.
  const CutRequest unlimited = twoStages();
  const double four = unlimited.memory->peakBytes(
      stageMemoryRequest(unlimited.options, kLayers, 0, 0, 4, kBatch / kMicroBatches));
  RecutPolicy policy(twoStages(static_cast<std::uint64_t>(four)), {0, 3, 6}, RecutOptions{});
  Simulated sim;
  const auto moves = run(policy, sim, 80, [](int step, Simulated& s) {
    if (step == 10) s.speed[1] = 0.2;
  });
  ASSERT_FALSE(moves.empty());
  for (const RecutMove& move : moves) EXPECT_LE(move.to[1], 4) << move.describe();
  EXPECT_EQ(policy.cuts(), (std::vector<int>{0, 4, 6}));
  // Without the budget the same run goes to 5 + 1.
  RecutPolicy free(twoStages(), {0, 3, 6}, RecutOptions{});
  Simulated again;
  run(free, again, 80, [](int step, Simulated& s) {
    if (step == 10) s.speed[1] = 0.2;
  });
  EXPECT_EQ(free.cuts(), (std::vector<int>{0, 5, 6}));
}

TEST(RecutPolicy, AMoveThatMeasuresWorseIsUndoneAndNotRetried) {
  // Layer 3 truly costs 3x what the profile says. The policy attributes stage 1's extra time to
  // its device and moves layer 3 to stage 0 (predicted +16%); measured, the step is 13% slower,
  // so it moves back and stays: no flapping between cuts the cost model misprices.
  RecutPolicy policy(twoStages(), {0, 3, 6}, RecutOptions{});
  Simulated sim;
  sim.cost[3] = 3.0;
  const auto moves = run(policy, sim, 200, [](int, Simulated&) {});
  ASSERT_EQ(moves.size(), 2u);
  EXPECT_EQ(moves[0].to, (std::vector<int>{0, 4, 6}));
  EXPECT_FALSE(moves[0].revert);
  EXPECT_TRUE(moves[1].revert);
  EXPECT_EQ(moves[1].to, (std::vector<int>{0, 3, 6}));
  EXPECT_EQ(policy.cuts(), (std::vector<int>{0, 3, 6}));
}

TEST(RecutPolicy, EqualSlowDownOfEveryStageMovesNothing) {
  RecutPolicy policy(twoStages(), {0, 3, 6}, RecutOptions{});
  Simulated sim;
  EXPECT_TRUE(run(policy, sim, 100, [](int step, Simulated& s) {
                if (step == 30) s.speed = {0.5, 0.5};
              }).empty());
}

TEST(RecutPolicy, RefusesBadOptionsAndFigures) {
  EXPECT_THROW(RecutPolicy(twoStages(), {0, 3, 6}, RecutOptions{0, 0.05, 5}), ConfigError);
  EXPECT_THROW(RecutPolicy(twoStages(), {0, 3, 6}, RecutOptions{20, 1.5, 5}), ConfigError);
  EXPECT_THROW(RecutPolicy(twoStages(), {0, 6}, RecutOptions{}), ConfigError);
  RecutPolicy policy(twoStages(), {0, 3, 6}, RecutOptions{});
  EXPECT_THROW(policy.update(1, {0.1}, {kBatch}, 0.1), ConfigError);
}

TEST(RecutPolicy, DescribesCuts) { EXPECT_EQ(describeCut({0, 3, 5, 6}), "3+2+1"); }

}  // namespace
}  // namespace chorus::parallel
