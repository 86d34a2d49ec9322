#include "chorus/plan/pipeline_partition.h"

#include <gtest/gtest.h>

#include <random>

namespace chorus::plan {
namespace {

// A random cost table: time grows with the layers a stage takes (as compute does), plus a
// random per-boundary transfer; some long stages do not fit; tails vary per stage.
struct RandomCosts {
  explicit RandomCosts(unsigned seed, int layers, int stages) : layers(layers) {
    std::mt19937 random(seed);
    std::uniform_real_distribution<double> unit(0.1, 1.0);
    for (int s = 0; s < stages; ++s) {
      speed.push_back(unit(random));
      limit.push_back(1 + static_cast<int>(random() % layers));
      tail_weight.push_back(unit(random));
    }
    for (int l = 0; l < layers; ++l) {
      work.push_back(unit(random));
      boundary.push_back(0.3 * unit(random));
    }
  }
  StageCost operator()(int s, int first, int last) const {
    StageCost cost;
    if (last - first > limit[s]) return cost;
    double compute = 0;
    for (int l = first; l < last; ++l) compute += work[l] / speed[s];
    cost.feasible = true;
    cost.monotone = compute;
    cost.time = compute + (last < layers ? boundary[last - 1] : 0);
    cost.tail = tail_weight[s] * (last - first);
    return cost;
  }
  int layers;
  std::vector<double> speed, tail_weight, work, boundary;
  std::vector<int> limit;
};

TEST(PipelinePartition, DynamicProgramEqualsBruteForceOnRandomTables) {
  int feasible = 0;
  for (unsigned seed = 1; seed <= 300; ++seed) {
    std::mt19937 random(seed);
    const int layers = 2 + static_cast<int>(random() % 9);
    const int stages = 1 + static_cast<int>(random() % std::min(layers, 5));
    const int micro_batches = 1 + static_cast<int>(random() % 8);
    const RandomCosts costs(seed, layers, stages);
    const StageCostFn fn = [&](int s, int i, int j) { return costs(s, i, j); };
    const auto fast = partitionLayers(layers, stages, micro_batches, fn);
    const auto slow = partitionLayersBruteForce(layers, stages, micro_batches, fn);
    ASSERT_EQ(fast.has_value(), slow.has_value()) << "seed " << seed;
    if (!fast) continue;
    ++feasible;
    EXPECT_NEAR(fast->objective, slow->objective, 1e-9 * slow->objective) << "seed " << seed;
    ASSERT_EQ(fast->cuts.size(), static_cast<size_t>(stages + 1));
    EXPECT_EQ(fast->cuts.front(), 0);
    EXPECT_EQ(fast->cuts.back(), layers);
  }
  EXPECT_GT(feasible, 200);
}

TEST(PipelinePartition, BalancesUnequalDevicesByLayerCount) {
  // 12 equal layers on a device twice as fast as the other: 8 + 4 balances them exactly.
  const StageCostFn fn = [](int s, int i, int j) {
    StageCost cost;
    cost.feasible = true;
    cost.time = cost.monotone = (j - i) * (s == 0 ? 1.0 : 2.0);
    return cost;
  };
  const auto partition = partitionLayers(12, 2, 8, fn);
  ASSERT_TRUE(partition);
  EXPECT_EQ(partition->cuts, (std::vector<int>{0, 8, 12}));
  EXPECT_DOUBLE_EQ(partition->objective, 16 + 7 * 8);
}

TEST(PipelinePartition, ReturnsNothingWhenNoStageFits) {
  const StageCostFn fn = [](int, int i, int j) {
    StageCost cost;
    cost.feasible = j - i <= 2;
    cost.time = cost.monotone = j - i;
    return cost;
  };
  EXPECT_FALSE(partitionLayers(7, 3, 4, fn));
  EXPECT_TRUE(partitionLayers(6, 3, 4, fn));
}

TEST(PipelinePartition, UpperBoundPrunes) {
  const StageCostFn fn = [](int, int i, int j) {
    StageCost cost;
    cost.feasible = true;
    cost.time = cost.monotone = j - i;
    return cost;
  };
  PartitionOptions options;
  options.upper_bound = 5;  // the best is 4 + 3 * 2 = 10
  EXPECT_FALSE(partitionLayers(4, 2, 4, fn, options));
}

}  // namespace
}  // namespace chorus::plan
