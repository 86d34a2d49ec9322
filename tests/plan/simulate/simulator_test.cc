#include "chorus/plan/simulator.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "chorus/core/error.h"
#include "plan/plan_test_util.h"

namespace chorus::plan {
namespace {

using testing::makeCluster;
using testing::uniformModel;

// A plan of `replicas` x `stages` ranks over devices 0..n-1 with equal cuts.
Plan gridPlan(const Cluster& cluster, int layers, int replicas, int stages, int share,
              int micro_batches, Schedule schedule) {
  Plan plan;
  plan.model = "uniform";
  plan.global_batch = share * replicas;
  plan.micro_batches = micro_batches;
  plan.schedule = schedule;
  for (int r = 0; r < replicas; ++r) {
    ReplicaPlan replica;
    replica.share = share;
    for (int s = 0; s < stages; ++s) {
      const int rank = r * stages + s;
      const int mb = stages > 1 ? (share + micro_batches - 1) / micro_batches : share;
      replica.stages.push_back({s * layers / stages, (s + 1) * layers / stages, rank, mb, false});
      RankPlan rank_plan;
      rank_plan.device = rank;
      rank_plan.precision = Dtype::kBf16;
      plan.ranks.push_back(rank_plan);
    }
    plan.replicas.push_back(replica);
  }
  return plan;
}

TEST(Simulator, TwoStageGpipeBubbleIsPMinusOneOverMPlusPMinusOne) {
  // Stage transfers on NVSwitch of a few KB: negligible next to the compute.
  const Cluster cluster = makeCluster({{"A100-80", "A100-80"}});
  const ModelProfile model = uniformModel(8, 1e6, 1e12, 1e7, 1e3);
  const CostModel cost(cluster, model);
  for (int m : {1, 2, 4, 8, 16}) {
    const Plan plan = gridPlan(cluster, 8, 1, 2, m, m, Schedule::kGpipe);
    const SimResult result = simulate(cost, plan);
    const double expected = 1.0 / (m + 1);
    EXPECT_NEAR(result.bubble_fraction, expected, 1e-3) << "M=" << m;
    EXPECT_NEAR(cost.evaluate(plan).prediction.bubble_fraction, expected, 1e-3) << "M=" << m;
    EXPECT_NEAR(result.step_seconds, cost.evaluate(plan).prediction.step_seconds,
                1e-3 * result.step_seconds);
  }
}

TEST(Simulator, OneFOneBMatchesGpipeTimeOnBalancedStages) {
  const Cluster cluster = makeCluster({{"H100-80", "H100-80", "H100-80", "H100-80"}});
  const ModelProfile model = uniformModel(8, 1e6, 1e12, 1e7, 1e3);
  const CostModel cost(cluster, model);
  const SimResult gpipe = simulate(cost, gridPlan(cluster, 8, 1, 4, 8, 8, Schedule::kGpipe));
  const SimResult one = simulate(cost, gridPlan(cluster, 8, 1, 4, 8, 8, Schedule::kOneFOneB));
  EXPECT_NEAR(one.step_seconds, gpipe.step_seconds, 1e-3 * gpipe.step_seconds);
  EXPECT_NEAR(one.bubble_fraction, 3.0 / 11, 1e-3);
}

TEST(Simulator, PureDataParallelAgreesWithTheCostModel) {
  // Two nodes, uneven shares, a large model so that the all-reduce matters: the simulator's
  // buckets overlap the last backward exactly as the analytic formula assumes.
  const Cluster cluster =
      makeCluster({{"A100-80", "A100-80"}, {"V100-32", "V100-32"}}, "nvswitch-a100", "eth-25g");
  const ModelProfile model = uniformModel(6, 5e7, 2e11, 2e7, 1e5);
  const CostModel cost(cluster, model);
  Plan plan = gridPlan(cluster, 6, 4, 1, 1, 1, Schedule::kOneFOneB);
  const int shares[] = {12, 12, 4, 4};
  plan.global_batch = 32;
  for (int r = 0; r < 4; ++r) {
    plan.replicas[r].share = shares[r];
    plan.replicas[r].stages[0].micro_batch = 4;
    plan.ranks[r].precision = r < 2 ? Dtype::kBf16 : Dtype::kFp16;
  }
  for (AllReduceAlgorithm algo : {AllReduceAlgorithm::kFlat, AllReduceAlgorithm::kHierarchical}) {
    plan.comm.algorithm = algo;
    const double predicted = cost.evaluate(plan).prediction.step_seconds;
    const SimResult result = simulate(cost, plan);
    EXPECT_NEAR(result.step_seconds, predicted, 1e-9 * predicted) << toString(algo);
    const double busiest = std::max(result.ranks[0].busy, result.ranks[2].busy);
    EXPECT_NEAR(result.bubble_fraction,
                1 - (2 * result.ranks[0].busy + 2 * result.ranks[2].busy) / (4 * busiest), 1e-12);
  }
}

TEST(Simulator, TransfersThatShareANetworkQueue) {
  // Two replicas of two stages whose activations cross 10 GbE. On four one-device nodes every
  // transfer has a network to itself; with two devices per node both replicas' transfers leave
  // through the same network and queue.
  const ModelProfile model = uniformModel(4, 1e6, 1e11, 1e7, 5e7);
  const Cluster spread =
      makeCluster({{"A100-80"}, {"A100-80"}, {"A100-80"}, {"A100-80"}}, "nvswitch-a100", "eth-10g");
  const Cluster paired =
      makeCluster({{"A100-80", "A100-80"}, {"A100-80", "A100-80"}}, "nvswitch-a100", "eth-10g");
  Plan plan = gridPlan(spread, 4, 2, 2, 8, 8, Schedule::kOneFOneB);
  const CostModel spread_cost(spread, model);
  const double alone = simulate(spread_cost, plan).step_seconds;
  // Stage 0 of both replicas on node 0, stage 1 of both on node 1.
  const int devices[] = {0, 2, 1, 3};
  for (int rank = 0; rank < 4; ++rank) plan.ranks[rank].device = devices[rank];
  const CostModel paired_cost(paired, model);
  const double queued = simulate(paired_cost, plan).step_seconds;
  EXPECT_GT(queued, 1.3 * alone);
  // The analytic model charges every transfer on the critical path: an upper bound of the
  // uncontended schedule.
  EXPECT_GE(paired_cost.evaluate(plan).prediction.step_seconds, alone);
}

TEST(Simulator, WritesAChromeTraceWithOneTrackPerRank) {
  const Cluster cluster = makeCluster({{"A100-80", "A100-80"}});
  const ModelProfile model = uniformModel(4, 1e6, 1e11, 1e7, 1e4);
  const CostModel cost(cluster, model);
  const Plan plan = gridPlan(cluster, 4, 1, 2, 4, 4, Schedule::kOneFOneB);
  const SimResult result = simulate(cost, plan);
  const auto trace = nlohmann::json::parse(chromeTrace(result, plan, cluster));
  int compute = 0, p2p = 0;
  for (const auto& event : trace["traceEvents"]) {
    if (event["ph"] != "X") continue;
    compute += event["cat"] == "compute";
    p2p += event["cat"] == "p2p";
    EXPECT_GE(event["dur"].get<double>(), 0);
  }
  EXPECT_EQ(compute, 2 * 2 * 4);  // 2 ranks x (F + B) x 4 micro-batches
  EXPECT_EQ(p2p, 2 * 4);          // activations and gradients, 4 micro-batches
  EXPECT_EQ(trace["displayTimeUnit"], "ms");
}

TEST(Simulator, RejectsPlansForAnotherModel) {
  const Cluster cluster = makeCluster({{"A100-80", "A100-80"}});
  const ModelProfile profile = uniformModel(4, 1, 1, 1, 1);
  const CostModel cost(cluster, profile);
  const Plan plan = gridPlan(cluster, 6, 1, 2, 4, 4, Schedule::kGpipe);
  EXPECT_THROW(simulate(cost, plan), ConfigError);
}

}  // namespace
}  // namespace chorus::plan
