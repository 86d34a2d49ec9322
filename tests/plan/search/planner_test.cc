#include "chorus/plan/planner.h"

#include <gtest/gtest.h>

#include <random>

#include "chorus/core/error.h"
#include "chorus/plan/transformer_shapes.h"
#include "plan/plan_test_util.h"

namespace chorus::plan {
namespace {

using testing::makeCluster;
using testing::randomCluster;
using testing::randomModel;
using testing::uniformModel;

PlanOptions smallOptions(std::mt19937& random) {
  PlanOptions options;
  options.global_batch = 2 + static_cast<int>(random() % 9);
  options.top_k = 3;
  options.allow_compression = random() % 2;
  options.max_zero_stage = static_cast<int>(random() % 4);
  if (random() % 3 == 0) options.schedules = {Schedule::kGpipe, Schedule::kOneFOneB};
  options.allow_checkpointing = random() % 4 != 0;
  // Host work per sample falls on each replica's own share: it moves data-parallel shares.
  if (random() % 2 == 0) options.cost.host_seconds_per_sample = 1e-3 * (random() % 100) / 100;
  options.zero_shards = random() % 2 ? ZeroShards::kMemory : ZeroShards::kEven;
  options.zero_in_pipelines = random() % 4 != 0;
  return options;
}

TEST(Planner, SearchFindsTheExhaustiveBestOnRandomSmallClusters) {
  int compared = 0, pipelines = 0, uneven = 0;
  for (unsigned seed = 1; compared < 100 && seed < 400; ++seed) {
    std::mt19937 random(seed);
    const Cluster cluster = randomCluster(random);
    const ModelProfile model = randomModel(random);
    const PlanOptions options = smallOptions(random);
    const PlanResult result = planCluster(cluster, model, options);
    const auto reference = exhaustivePlan(cluster, model, options);
    ASSERT_EQ(result.plans.empty(), !reference.has_value()) << "seed " << seed;
    if (!reference) continue;
    ++compared;
    const Plan& best = result.plans.front();
    EXPECT_NEAR(best.predicted.step_seconds, reference->predicted.step_seconds,
                1e-9 * reference->predicted.step_seconds)
        << "seed " << seed << ": search " << best.summary() << " vs exhaustive "
        << reference->summary() << " on " << cluster.describe();
    pipelines += best.stageCount() > 1;
    for (const auto& replica : best.replicas) uneven += replica.share != best.replicas[0].share;
  }
  EXPECT_EQ(compared, 100);
  // The random cases exercise both families.
  EXPECT_GT(pipelines, 0);
  EXPECT_GT(uneven, 0);
}

TEST(Planner, NeverReturnsPlansThatExceedMemory) {
  for (unsigned seed = 1; seed <= 30; ++seed) {
    std::mt19937 random(seed);
    const Cluster cluster = randomCluster(random);
    const ModelProfile model = randomModel(random);
    PlanOptions options = smallOptions(random);
    options.top_k = 10;
    const CostModel cost_model(cluster, model, options.cost);
    for (const Plan& plan : planCluster(cluster, model, options).plans) {
      const PlanCost cost = cost_model.evaluate(plan);
      EXPECT_TRUE(cost.feasible) << cost.infeasible_reason;
      for (size_t i = 0; i < plan.ranks.size(); ++i) {
        EXPECT_LE(cost.memory[i], cost.capacity[i]);
        EXPECT_EQ(plan.ranks[i].predicted_memory, static_cast<std::uint64_t>(cost.memory[i]));
      }
    }
  }
}

TEST(Planner, ReturnsNothingWhenTheModelFitsNowhere) {
  // 8 layers of 4e9 parameters (16 bytes each with Adam) = 512 GB of state on two 16 GB T4s.
  const Cluster cluster = makeCluster({{"T4", "T4"}});
  PlanOptions options;
  options.global_batch = 8;
  EXPECT_TRUE(planCluster(cluster, uniformModel(8, 4e9, 1e12, 1e8, 1e6), options).plans.empty());
}

TEST(Planner, GivesFasterDevicesLargerSharesAndBeatsEqualShares) {
  // A small model on one A100 and one T4: pure data parallelism, shares by speed.
  const Cluster cluster = makeCluster({{"A100-80", "T4"}});
  const ModelProfile model = uniformModel(4, 1e6, 1e11, 1e6, 1e5);
  PlanOptions options;
  options.global_batch = 64;
  options.allow_pipelines = false;
  options.allow_dropping_devices = false;
  const PlanResult result = planCluster(cluster, model, options);
  ASSERT_FALSE(result.plans.empty());
  const Plan& best = result.plans.front();
  ASSERT_EQ(best.replicas.size(), 2u);
  EXPECT_GT(best.replicas[0].share, 4 * best.replicas[1].share);
  ASSERT_TRUE(result.uniform_data_parallel);
  EXPECT_GT(result.gainOverUniform(), 2.0);
  EXPECT_NE(best.reason.find("uneven shares"), std::string::npos) << best.reason;
}

TEST(Planner, TopPlansAreDistinctStrategiesBestFirstWithReasons) {
  const Cluster cluster = makeCluster({{"A100-80", "A100-80", "V100-32", "V100-32"}});
  PlanOptions options;
  options.global_batch = 32;
  options.top_k = 4;
  const PlanResult result = planCluster(cluster, resolveModel("gpt3-1.3b"), options);
  ASSERT_EQ(result.plans.size(), 4u);
  for (size_t i = 1; i < result.plans.size(); ++i) {
    EXPECT_LE(result.plans[i - 1].predicted.step_seconds, result.plans[i].predicted.step_seconds);
    EXPECT_NE(result.plans[i].reason.find("slower than #1"), std::string::npos)
        << result.plans[i].reason;
  }
  EXPECT_EQ(result.plans[0].reason.rfind("best: ", 0), 0u) << result.plans[0].reason;
  EXPECT_EQ(result.devices, 4);
}

TEST(Planner, RejectsBadOptions) {
  const Cluster cluster = makeCluster({{"A100-80"}});
  PlanOptions options;
  EXPECT_THROW(planCluster(cluster, uniformModel(2, 1, 1, 1, 1), options), ConfigError);
  options.global_batch = 4;
  options.top_k = 0;
  EXPECT_THROW(planCluster(cluster, uniformModel(2, 1, 1, 1, 1), options), ConfigError);
}

}  // namespace
}  // namespace chorus::plan
