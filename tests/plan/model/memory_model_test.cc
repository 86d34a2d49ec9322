// The memory model's terms, exactly: state by ZeRO stage and precision, activations by micro-batch,
// micro-batches in flight and checkpointing mode, and the micro-batch that fits a capacity.
#include "chorus/plan/memory_model.h"

#include <gtest/gtest.h>

#include "chorus/core/error.h"
#include "plan/plan_test_util.h"

namespace chorus::plan {
namespace {

using testing::uniformModel;

// Layers of 1000 parameters; layer l keeps 100 * (l + 1) bytes per sample, outputs 10 and needs
// 7 bytes of workspace in backward; figures taken in fp32.
ModelProfile steppedModel(int layers) {
  ModelProfile model;
  model.name = "stepped";
  model.activation_element_bytes = 4;
  for (int l = 0; l < layers; ++l) {
    LayerProfile layer;
    layer.name = "l" + std::to_string(l);
    layer.params = 1000;
    layer.activation_bytes = 100.0 * (l + 1);
    layer.output_bytes = 10;
    layer.workspace_bytes = 7;
    model.layers.push_back(layer);
  }
  return model;
}

StageMemoryRequest stageOf(int first, int last, double micro_batch) {
  StageMemoryRequest request;
  request.first_layer = first;
  request.last_layer = last;
  request.micro_batch = micro_batch;
  return request;
}

TEST(MemoryModel, StateFollowsTheZeroStagesAndTheOptimizer) {
  const MemoryModel adam(uniformModel(4, 1e9, 1e12, 1e9, 1e7));
  const double p = 4e9;  // parameters of all four layers
  StageMemoryRequest request = stageOf(0, 4, 0);
  request.group = 8;
  // fp32 weights and gradients, Adam's m and v: 16 bytes per parameter without sharding; and,
  // accumulating, one layer's new gradient (4e9 bytes) beside the one it is added to.
  const double fresh = 4e9;
  EXPECT_DOUBLE_EQ(adam.peakBytes(request), 16 * p + fresh);
  // ZeRO-1 shards Adam's state and adds an fp32 master copy of the slice with its gradient; the
  // local gradients stay whole.
  request.zero_stage = 1;
  EXPECT_DOUBLE_EQ(adam.peakBytes(request), 8 * p + 16 * p / 8 + fresh);
  // A shard sized by memory instead of 1 / group.
  request.shard_fraction = 0.25;
  EXPECT_DOUBLE_EQ(adam.peakBytes(request), 8 * p + 16 * p * 0.25 + fresh);
  // zero.redundancy: a replica of the successor's slice (0.5 of the state here) holds its Adam
  // state, master copy and gradient too.
  request.replica_fraction = 0.5;
  EXPECT_DOUBLE_EQ(adam.peakBytes(request), 8 * p + 16 * p * 0.25 + 16 * p * 0.5 + fresh);
  request.replica_fraction = 0;
  request.shard_fraction = 0;
  // ZeRO-2 differs from ZeRO-1 in the reducer's buckets, which it frees after each reduce-scatter.
  request.zero_stage = 2;
  EXPECT_DOUBLE_EQ(adam.peakBytes(request), 8 * p + 16 * p / 8 + fresh);
  request.gradient_buckets = true;
  EXPECT_DOUBLE_EQ(adam.peakBytes(request), 8 * p + 16 * p / 8 + fresh);
  request.zero_stage = 1;
  EXPECT_DOUBLE_EQ(adam.peakBytes(request), 12 * p + 16 * p / 8 + fresh);
  request.gradient_buckets = false;
  // ZeRO-3 also shards the weights, which are the master slice (no copy of its own), and holds two
  // layers' full weights while they run (one running, the next gathered ahead: 2 x 4e9).
  request.zero_stage = 3;
  EXPECT_DOUBLE_EQ(adam.peakBytes(request), 4 * p + 16 * p / 8 + 2 * 4e9 + fresh);
  // One micro-batch allocates its gradients during its backward pass: no second copy.
  request.zero_stage = 0;
  request.gradients_held = false;
  EXPECT_DOUBLE_EQ(adam.peakBytes(request), 16 * p);
  request.gradients_held = true;
  // SGD with momentum keeps one buffer; the reducer's buckets are one more gradient copy.
  const MemoryModel sgd(uniformModel(4, 1e9, 1e12, 1e9, 1e7), MemoryOptions{4});
  request.zero_stage = 0;
  request.gradient_buckets = true;
  const MemoryEstimate bytes = sgd.estimate(request);
  EXPECT_DOUBLE_EQ(bytes.weights, 4 * p);
  EXPECT_DOUBLE_EQ(bytes.gradients, 4 * p);
  EXPECT_DOUBLE_EQ(bytes.optimizer, 4 * p);
  EXPECT_DOUBLE_EQ(bytes.buffers, 4 * p + fresh);
  // 16-bit training keeps fp32 parameters and adds autocast's 16-bit copies.
  request.dtype = Dtype::kBf16;
  EXPECT_DOUBLE_EQ(sgd.estimate(request).buffers, 4 * p + fresh + 2 * p);
}

TEST(MemoryModel, BackwardPeaksAtTheWidestPrefixPlusWorkspace) {
  const MemoryModel model(steppedModel(3), MemoryOptions{0});
  // Layers keep 100 + 200 + 300; backward of the last adds its 7 of workspace.
  EXPECT_DOUBLE_EQ(model.estimate(stageOf(0, 3, 1)).activations, 607);
  EXPECT_DOUBLE_EQ(model.estimate(stageOf(0, 3, 5)).activations, 5 * 607);
  // A later stage also keeps the input it received (layer 0's output, 10 bytes).
  EXPECT_DOUBLE_EQ(model.estimate(stageOf(1, 3, 1)).activations, 10 + 500 + 7);
  // Two more micro-batches in flight keep everything they kept after their forward.
  StageMemoryRequest held = stageOf(1, 3, 2);
  held.in_flight = 3;
  EXPECT_DOUBLE_EQ(model.estimate(held).activations, 2 * (2 * 510 + 517));
}

TEST(MemoryModel, CheckpointingKeepsInputsAndRecomputes) {
  const MemoryModel model(steppedModel(4), MemoryOptions{0});
  StageMemoryRequest request = stageOf(1, 4, 1);
  request.in_flight = 3;
  request.checkpointing = Checkpointing::kStage;
  // Each held micro-batch keeps the stage's input; one recomputes the whole stage.
  EXPECT_DOUBLE_EQ(model.estimate(request).activations, 2 * 10 + (10 + 900 + 7));
  request.checkpointing = Checkpointing::kLayer;
  // Each keeps the inputs of its three layers; one recomputes layer 3 (400 + 7) next to them.
  EXPECT_DOUBLE_EQ(model.estimate(request).activations, 2 * 30 + (30 + 400 + 7));
}

TEST(MemoryModel, ActivationsScaleToTheRanksFormat) {
  ModelProfile profile = steppedModel(1);
  profile.activation_element_bytes = 2;
  const MemoryModel model(profile, MemoryOptions{0});
  StageMemoryRequest request = stageOf(0, 1, 1);
  EXPECT_DOUBLE_EQ(model.estimate(request).activations, 2 * 107);
  request.dtype = Dtype::kFp16;
  EXPECT_DOUBLE_EQ(model.estimate(request).activations, 107);
}

TEST(MemoryModel, LargestMicroBatchSolvesTheCapacity) {
  const MemoryModel model(steppedModel(3), MemoryOptions{0});
  const StageMemoryRequest request = stageOf(0, 3, 0);
  const double fixed = 3000 * 8 + 1000 * 4;  // weights, gradients, one new layer gradient
  EXPECT_EQ(model.largestMicroBatch(request, fixed + 10 * 607, 100), 10);
  EXPECT_EQ(model.largestMicroBatch(request, fixed + 10 * 607 - 1, 100), 9);
  EXPECT_EQ(model.largestMicroBatch(request, fixed + 10 * 607, 4), 4);
  EXPECT_EQ(model.largestMicroBatch(request, fixed + 606, 100), 0);
}

TEST(MemoryModel, OneMicroBatchAllocatesItsGradientsDuringBackward) {
  const MemoryModel model(steppedModel(3), MemoryOptions{0});
  StageMemoryRequest request = stageOf(0, 3, 1);
  request.gradients_held = false;
  // At layer l backward holds what layers [0, l] keep, l's workspace and the gradients of layers
  // [l, 3): 107 + 12000 at layer 0 is the peak of one sample...
  EXPECT_DOUBLE_EQ(model.peakBytes(request), 12000 + 107 + 12000);
  // ... 60700 + 4000 at layer 2 that of a hundred.
  request.micro_batch = 100;
  EXPECT_DOUBLE_EQ(model.peakBytes(request), 12000 + 60700 + 4000);
  // Accumulating, all gradients and one fresh layer gradient are there at the peak.
  request.gradients_held = true;
  EXPECT_DOUBLE_EQ(model.peakBytes(request), 12000 + 12000 + 4000 + 60700);
}

TEST(MemoryModel, PipelineStagesHoldTheirDataTransfersAndTheirLayers) {
  ModelProfile profile = steppedModel(3);
  profile.input_bytes = 50;
  profile.target_bytes = 8;
  const MemoryModel model(profile, MemoryOptions{0});
  // The last stage, 1F1B with one micro-batch of 2 in flight, 4 per step: its layers' weights
  // (the trainer drops the others'), their gradients and a fresh one, the targets of 8 samples,
  // the next input received ahead (2 x 10), and backward's peak (2 x (10 + 500 + 7)).
  const StageMemoryRequest last =
      trainerStageRequest(1, 3, 3, Dtype::kFp32, 2, 1, 4, 0, 1, Checkpointing::kNone);
  EXPECT_DOUBLE_EQ(model.peakBytes(last), 8000 + 8000 + 4000 + (8 * 8 + 2 * 10 + 2 * 517));
  // The first stage, two in flight: the inputs of 8 samples, two received gradients (2 x 2 x
  // 10), one micro-batch kept (2 x 100) and backward's peak (2 x 107).
  const StageMemoryRequest first =
      trainerStageRequest(0, 1, 3, Dtype::kFp32, 2, 2, 4, 0, 1, Checkpointing::kNone);
  EXPECT_DOUBLE_EQ(model.peakBytes(first), 4000 + 4000 + 4000 + (8 * 50 + 40 + 200 + 214));
  // Large inputs: the batch as loaded, inputs and targets of 8 samples, is the last stage's peak.
  profile.input_bytes = 1000;
  EXPECT_DOUBLE_EQ(MemoryModel(profile, MemoryOptions{0}).peakBytes(last),
                   8000 + 8000 + 4000 + 8 * 1008);
}

TEST(MemoryModel, RefusesARangeOutsideTheModel) {
  const MemoryModel model(steppedModel(3));
  EXPECT_THROW(model.estimate(stageOf(2, 4, 1)), ConfigError);
  EXPECT_THROW(model.estimate(stageOf(2, 2, 1)), ConfigError);
  EXPECT_THROW(MemoryModel(steppedModel(1), MemoryOptions{-1}), ConfigError);
}

}  // namespace
}  // namespace chorus::plan
