#include "chorus/plan/fixed_plan.h"

#include <gtest/gtest.h>

#include "chorus/core/error.h"
#include "chorus/plan/local_cluster.h"
#include "chorus/plan/simulator.h"
#include "plan/plan_test_util.h"

namespace chorus::plan {
namespace {

// A host of two measured CPU workers, the second emulated at half speed.
Cluster halfSpeedHost() {
  MeasuredDevice cpu;
  cpu.name = "cpu";
  cpu.memory_bytes = 8ull << 30;
  cpu.gflops[static_cast<int>(Dtype::kFp32)] = 40;
  cpu.memory_bandwidth_gbs = 10;
  Cluster cluster("host");
  const int node = cluster.addNode("n", *findLinkType("shm"), *findLinkType("eth-10g"));
  cluster.addDevices(node, measuredDeviceType(cpu), 1);
  cluster.addDevices(node, measuredDeviceType(emulateDevice(cpu, "cpu@0.5", 0.5, 0)), 1);
  return cluster;
}

CostOptions noOverhead() {
  CostOptions options;
  options.layer_overhead_seconds = 0;
  return options;
}

TEST(FixedPlan, DataParallelKeepsTheGivenShares) {
  const Cluster cluster = halfSpeedHost();
  const ModelProfile model = testing::uniformModel(4, 100, 1e8, 64, 64);
  const CostModel cost(cluster, model, noOverhead());
  const Plan plan = fixedDataParallelPlan(cost, {10, 5}, 0, PrecisionPolicy::kFp32);
  EXPECT_EQ(plan.global_batch, 15);
  ASSERT_EQ(plan.replicas.size(), 2u);
  EXPECT_EQ(plan.replicas[0].share, 10);
  EXPECT_EQ(plan.replicas[1].share, 5);
  EXPECT_EQ(plan.replicas[1].stages[0].micro_batch, 5);  // the whole share in one pass
  EXPECT_EQ(plan.ranks[1].device_type, "cpu@0.5");
  EXPECT_EQ(plan.ranks[1].precision, Dtype::kFp32);
  EXPECT_EQ(plan.reason, "fixed by hand");
  const PlanCost priced = cost.evaluate(plan);
  EXPECT_DOUBLE_EQ(plan.predicted.step_seconds, priced.prediction.step_seconds);
  // Twice the samples on twice the speed: both ranks compute 3 x 4e8 x 5 / 20e9 s = 0.3 s.
  EXPECT_DOUBLE_EQ(priced.compute[0], 0.3);
  EXPECT_DOUBLE_EQ(priced.compute[1], 0.3);
  EXPECT_GT(plan.predicted.step_seconds, 0.3);  // plus the all-reduce and the optimizer
  const Plan micro = fixedDataParallelPlan(cost, {10, 5}, 4, PrecisionPolicy::kFp32);
  EXPECT_EQ(micro.replicas[0].stages[0].micro_batch, 4);
  EXPECT_THROW(fixedDataParallelPlan(cost, {10}, 0, PrecisionPolicy::kFp32), ConfigError);
  EXPECT_THROW(fixedDataParallelPlan(cost, {10, 0}, 0, PrecisionPolicy::kFp32), ConfigError);
}

TEST(FixedPlan, PipelineKeepsTheGivenCutsAndAgreesWithTheSimulator) {
  const Cluster cluster = halfSpeedHost();
  const ModelProfile model = testing::uniformModel(6, 100, 1e8, 64, 64);
  const CostModel cost(cluster, model, noOverhead());
  // 4 layers on the full-speed worker, 2 on the half-speed one: equal stage times.
  const Plan plan =
      fixedPipelinePlan(cost, {0, 4, 6}, 16, 8, Schedule::kGpipe, PrecisionPolicy::kFp32);
  EXPECT_EQ(plan.stageCount(), 2);
  EXPECT_EQ(plan.micro_batches, 8);
  EXPECT_EQ(plan.replicas[0].stages[0].last_layer, 4);
  EXPECT_EQ(plan.replicas[0].stages[1].rank, 1);
  EXPECT_EQ(plan.replicas[0].stages[1].micro_batch, 2);
  const SimResult simulated = simulate(cost, plan, {false});
  EXPECT_NEAR(simulated.step_seconds, plan.predicted.step_seconds,
              1e-9 + 0.02 * plan.predicted.step_seconds);
  EXPECT_THROW(fixedPipelinePlan(cost, {0, 6}, 16, 8, Schedule::kGpipe, PrecisionPolicy::kFp32),
               ConfigError);
  EXPECT_THROW(fixedPipelinePlan(cost, {0, 4, 5}, 16, 8, Schedule::kGpipe, PrecisionPolicy::kFp32),
               ConfigError);
  EXPECT_THROW(fixedPipelinePlan(cost, {0, 4, 6}, 4, 8, Schedule::kGpipe, PrecisionPolicy::kFp32),
               ConfigError);
}

// Host work per step that no layer covers is added once per step, by both models.
TEST(FixedPlan, StepOverheadAddsToTheCostModelAndTheSimulator) {
  const Cluster cluster = halfSpeedHost();
  const ModelProfile model = testing::uniformModel(4, 100, 1e8, 64, 64);
  const CostModel plain(cluster, model, noOverhead());
  CostOptions options = noOverhead();
  options.step_overhead_seconds = 0.25;
  const CostModel loaded(cluster, model, options);
  const Plan a = fixedDataParallelPlan(plain, {10, 5}, 0, PrecisionPolicy::kFp32);
  const Plan b = fixedDataParallelPlan(loaded, {10, 5}, 0, PrecisionPolicy::kFp32);
  EXPECT_DOUBLE_EQ(b.predicted.step_seconds, a.predicted.step_seconds + 0.25);
  EXPECT_DOUBLE_EQ(simulate(loaded, b, {false}).step_seconds,
                   simulate(plain, a, {false}).step_seconds + 0.25);
}

TEST(FixedPlan, HostWorkPerSampleFallsOnEachRanksOwnShare) {
  // 0.03 s of compute per sample on the full-speed worker, 0.06 s on the half-speed one: shares
  // {10, 5} finish their compute together, but the first loads twice the samples.
  const Cluster cluster = halfSpeedHost();
  const ModelProfile model = testing::uniformModel(4, 100, 1e8, 64, 64);
  const CostModel plain(cluster, model, noOverhead());
  CostOptions options = noOverhead();
  options.host_seconds_per_sample = 0.01;
  const CostModel loaded(cluster, model, options);
  const Plan a = fixedDataParallelPlan(plain, {10, 5}, 0, PrecisionPolicy::kFp32);
  const Plan b = fixedDataParallelPlan(loaded, {10, 5}, 0, PrecisionPolicy::kFp32);
  EXPECT_NEAR(b.predicted.step_seconds, a.predicted.step_seconds + 10 * 0.01, 1e-12);
  EXPECT_NEAR(simulate(loaded, b, {false}).step_seconds,
              simulate(plain, a, {false}).step_seconds + 10 * 0.01, 1e-12);
  // Compute alone is unchanged: the host work is not the device's.
  EXPECT_DOUBLE_EQ(b.predicted.compute_seconds, a.predicted.compute_seconds);
}

TEST(FixedPlan, AWorkerWithPartOfACorePaysItsLayerOverheadAtThatSpeed) {
  const Cluster cluster = halfSpeedHost();
  const ModelProfile model = testing::uniformModel(4, 100, 1e8, 64, 64);
  CostOptions options = noOverhead();
  options.layer_overhead_seconds = 1e-3;
  const CostModel cost(cluster, model, options);
  const DeviceType& full = cluster.device(0).type;
  const DeviceType& half = cluster.device(1).type;
  ASSERT_DOUBLE_EQ(half.core_fraction, 0.5);
  EXPECT_NEAR(cost.forwardSeconds(full, Dtype::kFp32, 0, 4, 1), 4e-3 + 4e8 / 40e9, 1e-15);
  EXPECT_NEAR(cost.forwardSeconds(half, Dtype::kFp32, 0, 4, 1), 8e-3 + 4e8 / 20e9, 1e-15);
  // A GPU's launch overhead is the host's: its core fraction does not apply.
  DeviceType gpu = *findDeviceType("A100-80");
  gpu.core_fraction = 0.5;
  EXPECT_DOUBLE_EQ(cost.layerOverhead(gpu), 1e-3);
}

}  // namespace
}  // namespace chorus::plan
