#include "chorus/model/mlp.h"

#include <gtest/gtest.h>
#include <torch/utils.h>

#include "chorus/core/error.h"

namespace chorus::model {
namespace {

// The MLP with every other key at its default.
ModelConfig mlpConfig() { return {.kind = "mlp"}; }

TEST(MlpTest, DefaultIsFashionMnist784To256To128To10) {
  Mlp model(mlpConfig(), 0);
  EXPECT_EQ(model.numLayers(), 3);
  torch::NoGradGuard no_grad;
  const at::Tensor out = model.forward(at::zeros({5, 1, 28, 28}));
  EXPECT_EQ(out.sizes(), (at::IntArrayRef{5, 10}));
  EXPECT_EQ(model.forwardRange(0, 1, at::zeros({5, 1, 28, 28})).sizes(), (at::IntArrayRef{5, 256}));
  // Flat inputs with the right number of features are accepted too.
  EXPECT_EQ(model.forward(at::zeros({2, 784})).sizes(), (at::IntArrayRef{2, 10}));
}

TEST(MlpTest, ProfileFollowsTheLinearFormulas) {
  Mlp model(mlpConfig(), 0);
  const std::vector<LayerProfile> profile = model.profile();
  ASSERT_EQ(profile.size(), 3u);
  EXPECT_EQ(profile[0].name, "fc1");
  EXPECT_EQ(profile[1].name, "fc2");
  EXPECT_EQ(profile[2].name, "head");
  EXPECT_EQ(profile[0].parameters, 784 * 256 + 256);
  EXPECT_EQ(profile[1].parameters, 256 * 128 + 128);
  EXPECT_EQ(profile[2].parameters, 128 * 10 + 10);
  EXPECT_EQ(profile[0].forward_flops, 2.0 * 784 * 256);
  EXPECT_EQ(profile[1].forward_flops, 2.0 * 256 * 128);
  EXPECT_EQ(profile[2].forward_flops, 2.0 * 128 * 10);
  double flops = 0;
  for (const LayerProfile& layer : profile) flops += layer.forward_flops;
  EXPECT_EQ(flops, 2.0 * (784 * 256 + 256 * 128 + 128 * 10));
  EXPECT_EQ(profile[0].activation_bytes, 256 * 4);
  EXPECT_EQ(profile[2].activation_bytes, 10 * 4);
  EXPECT_EQ(model.parameterCount(), 235146);
  EXPECT_EQ(model.describe(), "mlp(input=784, hidden=256x128, classes=10): 235.1 k parameters");
}

TEST(MlpTest, NoHiddenLayersIsALinearClassifier) {
  ModelConfig config = mlpConfig();
  config.hidden = {};
  config.input_shape = {3, 4, 4};
  Mlp model(config, 0);
  ASSERT_EQ(model.numLayers(), 1);
  EXPECT_EQ(model.profile()[0].name, "head");
  EXPECT_EQ(model.parameterCount(), 48 * 10 + 10);
  torch::NoGradGuard no_grad;
  EXPECT_EQ(model.forward(at::zeros({2, 3, 4, 4})).sizes(), (at::IntArrayRef{2, 10}));
  EXPECT_EQ(model.describe(), "mlp(input=48, hidden=none, classes=10): 490 parameters");
}

TEST(MlpTest, InitializationIsPyTorchsDefaultRange) {
  Mlp model(mlpConfig(), 7);
  const auto parameters = model.named_parameters();
  const double bound = 1.0 / std::sqrt(784.0);
  const at::Tensor weight = parameters["fc1.linear.weight"];
  EXPECT_LE(weight.abs().max().item<double>(), bound);
  EXPECT_GT(weight.abs().max().item<double>(), 0.99 * bound);
  EXPECT_NEAR(weight.mean().item<double>(), 0.0, 0.01 * bound);
}

TEST(MlpTest, RejectsInputsWithTheWrongFeatureCount) {
  Mlp model(mlpConfig(), 0);
  EXPECT_THROW(model.forward(at::zeros({2, 1, 27, 28})), ConfigError);
}

TEST(MlpTest, RejectsAConfigOfAnotherKind) {
  ModelConfig config = mlpConfig();
  config.kind = "cnn";
  EXPECT_THROW(Mlp(config, 0), ConfigError);
}

}  // namespace
}  // namespace chorus::model
