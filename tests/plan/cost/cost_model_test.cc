#include "chorus/plan/cost_model.h"

#include <gtest/gtest.h>

#include "chorus/core/error.h"
#include "chorus/plan/comm_cost.h"
#include "plan/plan_test_util.h"

namespace chorus::plan {
namespace {

using testing::link;
using testing::makeCluster;
using testing::type;
using testing::uniformModel;

TEST(CommCost, RingAllReduceFollowsTheAlphaBetaFormula) {
  const Cluster cluster = makeCluster({{"A100-80", "A100-80", "A100-80", "A100-80"}});
  const LinearCost cost = allReduceCost(cluster, {0, 1, 2, 3}, AllReduceAlgorithm::kFlat);
  const LinkType& nv = link("nvswitch-a100");
  EXPECT_DOUBLE_EQ(cost.latency, 6 * nv.latency);
  EXPECT_DOUBLE_EQ(cost.per_byte, 2.0 * 3 / 4 / nv.effectiveBandwidth());
  EXPECT_DOUBLE_EQ(allReduceCost(cluster, {2}, AllReduceAlgorithm::kFlat).per_byte, 0);
}

TEST(CommCost, HierarchicalBeatsARingThroughASlowNetwork) {
  // Two nodes of four over 10 GbE: the flat ring moves 2(n-1)/n S through the network, the
  // hierarchical one 2(N-1)/N S per node.
  const Cluster cluster = makeCluster(
      {{"A100-80", "A100-80", "A100-80", "A100-80"}, {"A100-80", "A100-80", "A100-80", "A100-80"}},
      "nvswitch-a100", "eth-10g");
  const std::vector<int> all = {0, 1, 2, 3, 4, 5, 6, 7};
  const double network = link("eth-10g").effectiveBandwidth();
  const LinearCost ring = allReduceCost(cluster, all, AllReduceAlgorithm::kFlat);
  const LinearCost tree = allReduceCost(cluster, all, AllReduceAlgorithm::kHierarchical);
  EXPECT_DOUBLE_EQ(ring.per_byte, 2.0 * 7 / 8 / network);
  EXPECT_NEAR(tree.per_byte,
              1.0 / network + 2.0 * 3 / 4 / link("nvswitch-a100").effectiveBandwidth(), 1e-18);
  // int8 compression of fp32 gradients quarters the network bytes.
  const LinearCost compressed =
      allReduceCost(cluster, all, AllReduceAlgorithm::kFlat, compressionRatio(CodecKind::kInt8, 4));
  EXPECT_DOUBLE_EQ(compressed.per_byte, 2.0 * 7 / 8 / 4 / network);
  EXPECT_DOUBLE_EQ(compressionRatio(CodecKind::kFp16, 2), 1);
  EXPECT_DOUBLE_EQ(compressionRatio(CodecKind::kBf16, 4), 0.5);  // as many bytes as fp16
  // What the model has no formula for is refused, not priced as something else.
  EXPECT_THROW(allReduceCost(cluster, all, AllReduceAlgorithm::kTwoD), ConfigError);
  EXPECT_THROW(compressionRatio(CodecKind::kPowerSgd, 4), ConfigError);
}

TEST(CommCost, ACodecsOwnCostCountsOnlyWhereItCompresses) {
  const Cluster two_nodes =
      makeCluster({{"A100-80", "A100-80"}, {"A100-80", "A100-80"}}, "nvswitch-a100", "eth-10g");
  const std::vector<int> all = {0, 1, 2, 3};
  const LinearCost plain = gradientAllReduceCost(two_nodes, all, AllReduceAlgorithm::kHierarchical,
                                                 CodecKind::kNone, 4, 1e-9);
  const LinearCost fp16 = gradientAllReduceCost(two_nodes, all, AllReduceAlgorithm::kHierarchical,
                                                CodecKind::kFp16, 4, 1e-9);
  const LinearCost free_codec = gradientAllReduceCost(
      two_nodes, all, AllReduceAlgorithm::kHierarchical, CodecKind::kFp16, 4, 0);
  // No codec, no codec cost; fp16 halves the network's bytes and adds its 1 ns per byte.
  EXPECT_DOUBLE_EQ(plain.per_byte,
                   allReduceCost(two_nodes, all, AllReduceAlgorithm::kHierarchical).per_byte);
  EXPECT_DOUBLE_EQ(free_codec.per_byte,
                   allReduceCost(two_nodes, all, AllReduceAlgorithm::kHierarchical, 0.5).per_byte);
  EXPECT_DOUBLE_EQ(fp16.per_byte, free_codec.per_byte + 1e-9);
  EXPECT_DOUBLE_EQ(fp16.latency, free_codec.latency);
  // Inside one node nothing is compressed, so nothing is charged.
  const LinearCost inside = gradientAllReduceCost(two_nodes, {0, 1}, AllReduceAlgorithm::kFlat,
                                                  CodecKind::kFp16, 4, 1e-9);
  EXPECT_DOUBLE_EQ(inside.per_byte,
                   allReduceCost(two_nodes, {0, 1}, AllReduceAlgorithm::kFlat).per_byte);
}

TEST(CommCost, BucketsOverlapTheBackwardPass) {
  const BucketedAllReduce sync = bucketedAllReduce({1e-3, 1e-9}, 100e6, 25e6);
  EXPECT_EQ(sync.buckets, 4);
  EXPECT_DOUBLE_EQ(sync.total, 4e-3 + 0.1);
  EXPECT_NEAR(sync.last, 1e-3 + 0.025, 1e-15);
  // A long backward hides all but the last bucket; a short one hides only a quarter of itself.
  EXPECT_NEAR(exposedSeconds(sync, 1.0), sync.last, 1e-15);
  EXPECT_NEAR(exposedSeconds(sync, 0.04), 0.01 + sync.total - 0.04, 1e-15);
}

// The cost model prices memory with the memory model (memory_model_test.cc pins its terms): a
// one-stage replica holds the reducer's buckets and, in one micro-batch, allocates its gradients
// during backward; a pipeline stage holds its share's data and the whole model's weights; a
// checkpointing stage recomputes layer by layer.
TEST(CostModel, StageMemoryIsTheMemoryModels) {
  const Cluster cluster = makeCluster({{"A100-80"}});
  const ModelProfile profile = uniformModel(4, 1e9, 1e12, 1e9, 1e7);
  const CostModel model(cluster, profile);
  StageMemoryRequest replica;
  replica.last_layer = 4;
  replica.dtype = Dtype::kBf16;
  replica.micro_batch = 3;
  replica.zero_stage = 1;
  replica.group = 8;
  replica.gradient_buckets = true;
  replica.gradients_held = false;
  EXPECT_DOUBLE_EQ(model.stageMemory(Dtype::kBf16, 0, 4, 3, 1, 1, 8, false, 1),
                   model.memory().peakBytes(replica));
  StageMemoryRequest stage;
  stage.first_layer = 1;
  stage.last_layer = 3;
  stage.micro_batch = 2;
  stage.in_flight = 2;
  stage.checkpointing = Checkpointing::kLayer;
  stage.batch_micro_batches = 4;
  stage.received_gradients = 2;
  stage.prefetched_inputs = 1;
  EXPECT_DOUBLE_EQ(model.stageMemory(Dtype::kFp32, 1, 3, 2, 2, 0, 1, true, 4),
                   model.memory().peakBytes(stage));
}

TEST(CostModel, ComputeIsARooflineWithOverheadAndCalibratesPerType) {
  const Cluster cluster = makeCluster({{"A100-80"}});
  CostOptions options;
  const ModelProfile profile = uniformModel(2, 1e6, 1e12, 1e6, 1e4);
  const CostModel model(cluster, profile, options);
  const DeviceType& a100 = type("A100-80");
  // Compute-bound: 2 layers x 1e12 FLOPs x 8 samples at 50% of 312 TFLOP/s.
  const double expected = 2 * options.layer_overhead_seconds + 16e12 / (0.5 * 312e12);
  EXPECT_DOUBLE_EQ(model.forwardSeconds(a100, Dtype::kBf16, 0, 2, 8), expected);
  EXPECT_DOUBLE_EQ(model.microBatchSeconds(a100, Dtype::kBf16, 0, 2, 8, false), 3 * expected);
  EXPECT_DOUBLE_EQ(model.microBatchSeconds(a100, Dtype::kBf16, 0, 2, 8, true), 4 * expected);
  options.calibrations.push_back({"A100-80", Dtype::kBf16, 0.25});
  const CostModel calibrated(cluster, profile, options);
  EXPECT_DOUBLE_EQ(calibrated.forwardSeconds(a100, Dtype::kBf16, 0, 2, 8),
                   2 * options.layer_overhead_seconds + 16e12 / (0.25 * 312e12));
  // Memory-bound: huge weights, few FLOPs.
  const ModelProfile heavy = uniformModel(1, 1e10, 1e6, 0, 0);
  const CostModel streaming(cluster, heavy, options);
  EXPECT_DOUBLE_EQ(streaming.forwardSeconds(a100, Dtype::kBf16, 0, 1, 1),
                   options.layer_overhead_seconds + 2e10 / (2039e9 * 0.8));
  EXPECT_EQ(CostModel::trainingDtype(type("V100-32"), PrecisionPolicy::kMixed), Dtype::kFp16);
  EXPECT_EQ(CostModel::trainingDtype(a100, PrecisionPolicy::kMixed), Dtype::kBf16);
  EXPECT_EQ(CostModel::trainingDtype(a100, PrecisionPolicy::kTf32), Dtype::kTf32);
  EXPECT_EQ(CostModel::trainingDtype(type("T4"), PrecisionPolicy::kTf32), Dtype::kFp32);
}

TEST(CostModel, PipelineStepIsSumPlusMMinusOneTimesSlowest) {
  // Two stages on identical devices with no synchronization (one replica): the GPipe formula,
  // the first stage also paying its boundary (empty activations: the link's latency, twice).
  const Cluster cluster = makeCluster({{"H100-80", "H100-80"}});
  const ModelProfile profile = uniformModel(4, 1e6, 1e12, 1e7, 0);
  const CostModel model(cluster, profile);
  Plan plan;
  plan.global_batch = 8;
  plan.micro_batches = 4;
  plan.replicas.push_back({8, {{0, 3, 0, 2, false}, {3, 4, 1, 2, false}}});
  plan.ranks.resize(2);
  plan.ranks[0].device = 0;
  plan.ranks[1].device = 1;
  plan.ranks[0].precision = plan.ranks[1].precision = Dtype::kBf16;
  const DeviceType& h100 = type("H100-80");
  const double first = model.microBatchSeconds(h100, Dtype::kBf16, 0, 3, 2, false) +
                       2 * link("nvswitch-a100").latency;
  const double second = model.microBatchSeconds(h100, Dtype::kBf16, 3, 4, 2, false);
  const double optimizer = model.optimizerSeconds(h100, 3e6, 1);
  const PlanCost cost = model.evaluate(plan);
  EXPECT_NEAR(cost.prediction.step_seconds, first + second + 3 * first + optimizer, 1e-12);
  const double busy = 4 * (first - 2 * link("nvswitch-a100").latency + second);
  EXPECT_NEAR(cost.prediction.bubble_fraction, 1 - busy / (2 * (first + second + 3 * first)),
              1e-12);
  EXPECT_TRUE(cost.feasible);
}

}  // namespace
}  // namespace chorus::plan
