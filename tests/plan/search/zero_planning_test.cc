// How the planner prices ZeRO: shards sized by each device's memory (as the runtime's
// `zero.shards = "memory"` runs them), and ZeRO-1/2's parameter all-gather after the optimizer
// step, which nothing overlaps, so that sharding is weighed against replication rather than
// preferred everywhere.
#include <gtest/gtest.h>

#include "chorus/plan/cost_model.h"
#include "chorus/plan/planner.h"
#include "chorus/plan/simulator.h"
#include "plan/plan_test_util.h"

namespace chorus::plan {
namespace {

using testing::makeCluster;
using testing::uniformModel;

// 1.1e9 parameters in 16 layers. Replicated (20 bytes per parameter with AdamW) it does not fit
// a T4 (16 GB); ZeRO-3 with even shards leaves the T4 short too (its whole local gradients, the
// fp16 copy, two gathered layers and half of 17.6 GB of sharded state), and an A100-80 beside it
// holds it only if the T4 takes the smaller shard.
ModelProfile billion() { return uniformModel(16, 6.875e7, 1e12, 1e7, 1e6); }

PlanOptions dataParallelOnly(int global_batch) {
  PlanOptions options;
  options.global_batch = global_batch;
  options.allow_pipelines = false;
  options.allow_dropping_devices = false;
  options.allow_checkpointing = false;
  return options;
}

TEST(ZeroPlanning, ShardsSizedByMemoryFitWhereEvenShardsDoNot) {
  const Cluster cluster = makeCluster({{"A100-80", "T4"}});
  PlanOptions options = dataParallelOnly(8);
  options.zero_shards = ZeroShards::kEven;
  EXPECT_TRUE(planCluster(cluster, billion(), options).plans.empty());

  options.zero_shards = ZeroShards::kMemory;
  const PlanResult result = planCluster(cluster, billion(), options);
  ASSERT_FALSE(result.plans.empty());
  const Plan& best = result.plans.front();
  EXPECT_GE(best.zero_stage, 1);
  ASSERT_EQ(best.zero_shards.size(), 2u);
  EXPECT_NEAR(best.zero_shards[0] + best.zero_shards[1], 1.0, 1e-12);
  EXPECT_GT(best.zero_shards[0], 3 * best.zero_shards[1]) << best.summary();
  const ModelProfile profile = billion();
  const CostModel model(cluster, profile, options.cost);
  const PlanCost cost = model.evaluate(best);
  EXPECT_TRUE(cost.feasible) << cost.infeasible_reason;
  // Both ranks are left the same fraction of their headroom, so neither is much fuller.
  for (size_t r = 0; r < 2; ++r) EXPECT_LE(cost.memory[r], cost.capacity[r]);
  EXPECT_GT(cost.memory[1] / cost.capacity[1], 0.5);
}

// Two A100s over a slow link (10 Gbit/s between nodes): ZeRO-1 all-reduces the gradients as
// stage 0 does, behind the backward pass, steps half the optimizer, and then all-gathers the
// parameters, exposed.
TEST(ZeroPlanning, TheParameterGatherFollowsTheShardedOptimizerStep) {
  const Cluster cluster = makeCluster({{"A100-80"}, {"A100-80"}}, "nvswitch-a100", "eth-10g");
  const ModelProfile profile = uniformModel(8, 1e7, 1e12, 1e7, 1e6);
  const CostModel model(cluster, profile);
  PlanOptions options = dataParallelOnly(16);
  options.max_zero_stage = 0;
  const PlanResult replicated = planCluster(cluster, profile, options);
  ASSERT_FALSE(replicated.plans.empty());
  Plan zero1 = replicated.plans.front();
  zero1.zero_stage = 1;
  const PlanCost stage0 = model.evaluate(replicated.plans.front());
  const PlanCost stage1 = model.evaluate(zero1);
  const double params = 8 * 1e7;
  const DeviceType& a100 = cluster.device(0).type;
  const double saved = model.optimizerSeconds(a100, params, 1) / 2;
  const LinearCost fp32 =
      gradientAllReduceCost(cluster, {0, 1}, AllReduceAlgorithm::kFlat, CodecKind::kNone, 4);
  const double gather = 0.5 * fp32.seconds(params * 4);
  EXPECT_NEAR(stage1.prediction.step_seconds - stage0.prediction.step_seconds, gather - saved,
              1e-9 * stage0.prediction.step_seconds);
  EXPECT_GT(gather, saved);  // so across this link the planner keeps the replicated plan
  options.max_zero_stage = 3;
  const PlanResult weighed = planCluster(cluster, profile, options);
  ASSERT_FALSE(weighed.plans.empty());
  EXPECT_EQ(weighed.plans.front().zero_stage, 0) << weighed.plans.front().summary();
}

TEST(ZeroPlanning, TheSimulatorRunsTheGatherAfterEveryShardsStep) {
  const Cluster cluster = makeCluster({{"A100-80", "T4"}});
  const ModelProfile profile = billion();
  const CostModel model(cluster, profile);
  const PlanResult result = planCluster(cluster, profile, dataParallelOnly(8));
  ASSERT_FALSE(result.plans.empty());
  Plan plan = result.plans.front();
  plan.zero_stage = 1;
  SimOptions trace;
  trace.trace = true;
  const SimResult simulated = simulate(model, plan, trace);
  double last_optimizer_end = 0, gather_start = -1;
  for (const TraceSpan& span : simulated.spans) {
    if (span.category == "optimizer")
      last_optimizer_end = std::max(last_optimizer_end, span.start + span.duration);
    if (span.category == "allgather") gather_start = span.start;
  }
  ASSERT_GE(gather_start, 0);
  EXPECT_GE(gather_start, last_optimizer_end - 1e-12);
  for (const RankActivity& rank : simulated.ranks)
    EXPECT_GT(rank.finish, last_optimizer_end - 1e-12);
}

}  // namespace
}  // namespace chorus::plan
