#include "chorus/model/cnn.h"

#include <gtest/gtest.h>
#include <torch/utils.h>

#include "chorus/core/error.h"

namespace chorus::model {
namespace {

// The CNN with every other key at its default.
const ModelConfig kCnn{.kind = "cnn"};

TEST(CnnTest, DefaultHasStemTwoBlocksAndHead) {
  Cnn model(kCnn, 0);
  ASSERT_EQ(model.numLayers(), 4);
  const std::vector<LayerProfile> profile = model.profile();
  EXPECT_EQ(profile[0].name, "stem");
  EXPECT_EQ(profile[1].name, "block1");
  EXPECT_EQ(profile[2].name, "block2");
  EXPECT_EQ(profile[3].name, "head");
  torch::NoGradGuard no_grad;
  const at::Tensor x = at::randn({3, 1, 28, 28});
  // The stem halves the resolution; blocks keep it; the head pools it to a 4x4 grid.
  EXPECT_EQ(model.forwardRange(0, 1, x).sizes(), (at::IntArrayRef{3, 32, 14, 14}));
  EXPECT_EQ(model.forwardRange(0, 3, x).sizes(), (at::IntArrayRef{3, 32, 14, 14}));
  EXPECT_EQ(model.forward(x).sizes(), (at::IntArrayRef{3, 10}));
}

TEST(CnnTest, ProfileFollowsTheConvolutionFormulas) {
  Cnn model(kCnn, 0);
  const std::vector<LayerProfile> profile = model.profile();
  const double map = 14.0 * 14.0;
  EXPECT_EQ(profile[0].forward_flops, 2.0 * 1 * 32 * 9 * map);
  EXPECT_EQ(profile[1].forward_flops, 2.0 * (2.0 * 32 * 32 * 9 * map));
  EXPECT_EQ(profile[3].forward_flops, 2.0 * 32 * 16 * 10);
  EXPECT_EQ(profile[0].activation_bytes, 32 * 14 * 14 * 4);
  EXPECT_EQ(profile[2].activation_bytes, 32 * 14 * 14 * 4);
  EXPECT_EQ(profile[3].activation_bytes, 10 * 4);
  // Convolutions before GroupNorm have no bias; each norm has a scale and a shift per channel.
  EXPECT_EQ(profile[0].parameters, 1 * 32 * 9 + 2 * 32);
  EXPECT_EQ(profile[1].parameters, 2 * (32 * 32 * 9 + 2 * 32));
  EXPECT_EQ(profile[3].parameters, 32 * 16 * 10 + 10);
  EXPECT_EQ(model.parameterCount(), 352 + 2 * 18560 + 5130);
  EXPECT_EQ(model.describe(),
            "cnn(channels=32, blocks=2, groups=8, classes=10): 42.6 k parameters");
}

TEST(CnnTest, OddSizedRgbInputsAndNoNormalization) {
  ModelConfig config = kCnn;
  config.input_shape = {3, 13, 9};
  config.channels = 6;
  config.blocks = 0;
  config.groups = 0;
  Cnn model(config, 0);
  ASSERT_EQ(model.numLayers(), 2);
  torch::NoGradGuard no_grad;
  const at::Tensor x = at::randn({2, 3, 13, 9});
  EXPECT_EQ(model.forwardRange(0, 1, x).sizes(), (at::IntArrayRef{2, 6, 7, 5}));
  EXPECT_EQ(model.forward(x).sizes(), (at::IntArrayRef{2, 10}));
  // Without a norm the convolutions carry a bias.
  EXPECT_EQ(model.profile()[0].parameters, 3 * 6 * 9 + 6);
  EXPECT_EQ(model.profile()[0].forward_flops, 2.0 * 3 * 6 * 9 * 7 * 5);
}

TEST(CnnTest, OutputsOfOneSampleDoNotDependOnTheRestOfTheBatch) {
  // What GroupNorm buys over BatchNorm: a sample's logits are the same alone or in any batch.
  Cnn model(kCnn, 3);
  torch::NoGradGuard no_grad;
  const at::Tensor x = at::randn({4, 1, 28, 28});
  const at::Tensor batched = model.forward(x);
  for (std::int64_t i = 0; i < 4; ++i)
    EXPECT_TRUE(
        at::allclose(model.forward(x.narrow(0, i, 1)), batched.narrow(0, i, 1), 1e-5, 1e-6));
}

TEST(CnnTest, RejectsInputsWithTheWrongChannels) {
  Cnn model(kCnn, 0);
  EXPECT_THROW(model.forward(at::zeros({2, 3, 28, 28})), ConfigError);
  EXPECT_THROW(model.forward(at::zeros({2, 28, 28})), ConfigError);
}

}  // namespace
}  // namespace chorus::model
