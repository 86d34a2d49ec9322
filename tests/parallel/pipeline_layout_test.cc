// Pipeline options, the rank layout and the stage cuts (even, explicit, and automatic for
// unlike devices).
#include "chorus/parallel/pipeline_layout.h"

#include <gtest/gtest.h>

#include "chorus/core/error.h"
#include "chorus/model/model_config.h"

namespace chorus::parallel {
namespace {

std::vector<model::LayerProfile> gptProfile(std::int64_t blocks) {
  model::ModelConfig config;
  config.kind = "gpt";
  config.vocab = 32;
  config.layers = blocks;
  config.width = 64;
  config.heads = 2;
  config.context = 32;
  return model::makeModel(config, 1)->profile();
}

// A memory model of `profile`: autograd keeping 24 bytes per byte of each layer's output (above
// what a GPT block keeps), SGD-with-momentum-sized state.
std::shared_ptr<const plan::MemoryModel> memoryOf(const std::vector<model::LayerProfile>& profile) {
  plan::ModelProfile model;
  model.name = "gpt";
  model.activation_element_bytes = 4;
  for (const model::LayerProfile& layer : profile) {
    const double output = static_cast<double>(layer.activation_bytes);
    model.layers.push_back({layer.name, static_cast<double>(layer.parameters), layer.forward_flops,
                            24 * output, output});
  }
  return std::make_shared<const plan::MemoryModel>(model, plan::MemoryOptions{8});
}

CutRequest request(std::int64_t blocks, const std::string& partition,
                   std::vector<std::vector<StageDevice>> devices) {
  CutRequest request;
  request.profile = gptProfile(blocks);
  request.memory = memoryOf(request.profile);
  request.options.pipeline_stages = static_cast<int>(devices.at(0).size());
  request.options.replicas = static_cast<int>(devices.size());
  request.options.micro_batches = 4;
  request.options.global_batch = 32;
  request.options.partition = partition;
  request.devices = std::move(devices);
  return request;
}

// Forward FLOPs of the layers [first, last) of a profile.
double flops(const std::vector<model::LayerProfile>& profile, int first, int last) {
  double total = 0;
  for (int l = first; l < last; ++l) total += profile[l].forward_flops;
  return total;
}

TEST(PipelineLayout, MapsRanksReplicaMajor) {
  const PipelineLayout layout(2, 3);
  EXPECT_EQ(layout.worldSize(), 6);
  EXPECT_EQ(layout.rankOf(1, 2), 5);
  EXPECT_EQ(layout.positionOf(4).replica, 1);
  EXPECT_EQ(layout.positionOf(4).stage, 1);
  EXPECT_EQ(layout.stageGroup(1), (std::vector<int>{1, 4}));
  EXPECT_THROW(layout.positionOf(6), ConfigError);
  EXPECT_THROW(PipelineLayout(0, 1), ConfigError);
}

TEST(PipelineLayout, SharesAndMicroBatches) {
  PipelineOptions options;
  options.replicas = 3;
  options.global_batch = 10;
  EXPECT_EQ(replicaShares(options), (std::vector<std::int64_t>{4, 3, 3}));
  options.replica_shares = {2, 7, 1};
  EXPECT_EQ(replicaShares(options), (std::vector<std::int64_t>{2, 7, 1}));
  options.replica_shares = {2, 7, 2};
  EXPECT_THROW(replicaShares(options), ConfigError);
  EXPECT_EQ(microBatchSizes(10, 4), (std::vector<std::int64_t>{3, 3, 2, 2}));
  EXPECT_THROW(microBatchSizes(3, 4), ConfigError);
}

TEST(PipelineLayout, RejectsBadOptions) {
  PipelineOptions options;
  options.global_batch = 8;
  options.pipeline_stages = 3;
  EXPECT_NO_THROW(validatePipelineOptions(options, 4));
  EXPECT_THROW(validatePipelineOptions(options, 2), ConfigError);  // more stages than layers
  options.micro_batches = 9;
  EXPECT_THROW(validatePipelineOptions(options, 4), ConfigError);  // share below M
  options.micro_batches = 2;
  options.partition = "2,x";
  EXPECT_THROW(validatePipelineOptions(options, 4), ConfigError);
  options.partition = "2,1,2";
  EXPECT_THROW(validatePipelineOptions(options, 4), ConfigError);  // sums to 5
  options.partition = "2,1,1";
  EXPECT_NO_THROW(validatePipelineOptions(options, 4));
  EXPECT_EQ(plan::parseCheckpointing("layer"), Checkpointing::kLayer);
  EXPECT_EQ(plan::parseCheckpointing("on"), Checkpointing::kStage);
  EXPECT_THROW(plan::parseCheckpointing("sometimes"), ConfigError);
}

TEST(PipelineLayout, EvenAndExplicitCuts) {
  // The GPT with 8 blocks has 10 layers (embed, blocks, head).
  EXPECT_EQ(stageCuts(request(8, "even", {{{}, {}, {}}})), (std::vector<int>{0, 4, 7, 10}));
  EXPECT_EQ(stageCuts(request(8, "6,4", {{{}, {}}})), (std::vector<int>{0, 6, 10}));
}

// Issue 6: with emulated speeds {1.0, 0.4} the automatic cut gives the fast device
// proportionally more of the work: ideally 1 / 1.4 = 71% of the FLOPs.
TEST(PipelineLayout, AutoCutGivesTheFastDeviceProportionallyMoreLayers) {
  for (bool fast_first : {true, false}) {
    const StageDevice fast{1.0, 0}, slow{0.4, 0};
    const CutRequest cut_request = request(
        12, "auto",
        {fast_first ? std::vector<StageDevice>{fast, slow} : std::vector<StageDevice>{slow, fast}});
    const std::vector<int> cuts = stageCuts(cut_request);
    ASSERT_EQ(cuts.size(), 3u);
    const auto& profile = cut_request.profile;
    const int fast_stage = fast_first ? 0 : 1;
    const int fast_layers = cuts[fast_stage + 1] - cuts[fast_stage];
    const int slow_layers = cuts[2 - fast_stage] - cuts[1 - fast_stage];
    const double fast_share = flops(profile, cuts[fast_stage], cuts[fast_stage + 1]) /
                              flops(profile, 0, static_cast<int>(profile.size()));
    std::printf("speeds %s: cuts %d|%d|%d, fast device %d layers, %.2f of the FLOPs\n",
                fast_first ? "{1.0, 0.4}" : "{0.4, 1.0}", cuts[0], cuts[1], cuts[2], fast_layers,
                fast_share);
    EXPECT_GT(fast_layers, 2 * slow_layers);
    EXPECT_NEAR(fast_share, 1.0 / 1.4, 0.06);
  }
}

// The cut has no time model of its own: a stage costs what the planner's cost model says, on the
// reference device, and 1 / speed of that on a device of speed `speed`.
TEST(PipelineLayout, StageSecondsAreThePlansCostModels) {
  CutRequest cut_request = request(4, "auto", {{{}, {}}});
  plan::ModelProfile model;
  model.activation_element_bytes = 4;
  for (const model::LayerProfile& layer : cut_request.profile) {
    const double output = static_cast<double>(layer.activation_bytes);
    model.layers.push_back(
        {layer.name, static_cast<double>(layer.parameters), layer.forward_flops, output, output});
  }
  const plan::Cluster cluster;
  const plan::CostModel cost(cluster, model);
  EXPECT_DOUBLE_EQ(stageSeconds(cut_request, 1, 4, 8),
                   cost.microBatchSeconds(cut_request.reference, plan::Dtype::kFp32, 1, 4, 8,
                                          /*checkpoint=*/false));
  // Checkpointing costs one more forward: 4 passes instead of 3.
  CutRequest checkpointed = cut_request;
  checkpointed.options.activation_checkpointing = Checkpointing::kLayer;
  EXPECT_DOUBLE_EQ(stageSeconds(checkpointed, 1, 4, 8), stageSeconds(cut_request, 1, 4, 8) * 4 / 3);
  EXPECT_EQ(stageSeconds(cut_request, 2, 2, 8), 0);
  EXPECT_THROW(stageSeconds(cut_request, 3, 7, 8), ConfigError);  // 6 layers
  EXPECT_THROW(stageSeconds(cut_request, 2, 1, 8), ConfigError);
}

TEST(PipelineLayout, AutoCutBalancesEqualDevicesLikeEven) {
  const std::vector<int> cuts = stageCuts(request(8, "auto", {{{}, {}}}));
  // Embed is nearly free and the head costs about a block: 1 + 4 blocks | 4 blocks + head, or
  // one block either way.
  EXPECT_NEAR(cuts[1], 5, 1);
}

TEST(PipelineLayout, AutoCutKeepsEachStageWithinItsMemory) {
  CutRequest unlimited = request(8, "auto", {{{1.0, 0}, {0.4, 0}}});
  const std::vector<int> free_cuts = stageCuts(unlimited);
  // Give the fast device exactly the memory of two layers fewer than it would take.
  const int limit_layers = free_cuts[1] - 2;
  const double bytes = unlimited.memory->peakBytes(
      stageMemoryRequest(unlimited.options, unlimited.memory->model().layerCount(), 0, 0,
                         limit_layers, 8));  // 1F1B, stage 0 of 2
  CutRequest limited = request(8, "auto", {{{1.0, static_cast<std::uint64_t>(bytes)}, {0.4, 0}}});
  EXPECT_EQ(stageCuts(limited)[1], limit_layers);
  // Checkpointing frees enough activation memory to take more layers within the same limit.
  limited.options.activation_checkpointing = Checkpointing::kStage;
  EXPECT_GT(stageCuts(limited)[1], limit_layers);
  // Nothing fits: a clear error.
  CutRequest impossible = request(8, "auto", {{{1.0, 1000}, {0.4, 1000}}});
  EXPECT_THROW(stageCuts(impossible), ConfigError);
}

TEST(PipelineLayout, HybridCutUsesTheSlowestReplicaPerStage) {
  // Replica 1 has its slow device first: the stage-0 bottleneck is set by it. (The cost model
  // cuts 4 | 10, the FLOP estimate before it 5 | 9: its per-layer overhead prices the embedding
  // like most of a block.)
  const std::vector<int> cuts =
      stageCuts(request(12, "auto", {{{1.0, 0}, {1.0, 0}}, {{0.5, 0}, {1.0, 0}}}));
  EXPECT_LT(cuts[1], 7);
}

}  // namespace
}  // namespace chorus::parallel
