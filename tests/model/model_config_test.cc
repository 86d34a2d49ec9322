#include "chorus/model/model_config.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "chorus/core/error.h"
#include "chorus/model/cnn.h"
#include "chorus/model/gpt.h"
#include "chorus/model/mlp.h"

namespace chorus::model {
namespace {

// Expects validateModelConfig to throw ConfigError whose message contains `needle`.
void expectRejected(const ModelConfig& config, const std::string& needle) {
  try {
    validateModelConfig(config);
    ADD_FAILURE() << "accepted a config that should fail with \"" << needle << "\"";
  } catch (const ConfigError& error) {
    EXPECT_NE(error.message().find(needle), std::string::npos) << error.message();
  }
}

ModelConfig withKind(const std::string& kind) {
  ModelConfig config;
  config.kind = kind;
  return config;
}

TEST(ModelConfigTest, DefaultsOfEveryKindAreValid) {
  EXPECT_EQ(ModelConfig{}.kind, "cnn");
  for (const std::string& kind : modelKinds()) EXPECT_NO_THROW(validateModelConfig(withKind(kind)));
}

TEST(ModelConfigTest, MakeModelBuildsTheKindAsked) {
  EXPECT_NE(dynamic_cast<Mlp*>(makeModel(withKind("mlp"), 0).get()), nullptr);
  EXPECT_NE(dynamic_cast<Cnn*>(makeModel(withKind("cnn"), 0).get()), nullptr);
  ModelConfig gpt = withKind("gpt");
  gpt.layers = 1;
  EXPECT_NE(dynamic_cast<Gpt*>(makeModel(gpt, 0).get()), nullptr);
}

TEST(ModelConfigTest, UnknownKindListsTheKnownOnes) {
  expectRejected(withKind("resnet"),
                 "model.kind \"resnet\" is unknown; known kinds: mlp, cnn, gpt");
  EXPECT_THROW(makeModel(withKind("resnet"), 0), ConfigError);
}

TEST(ModelConfigTest, GptFieldsAreChecked) {
  ModelConfig config = withKind("gpt");
  config.width = 130;
  expectRejected(config, "model.width (130) must be divisible by model.heads (4)");
  config = withKind("gpt");
  config.layers = 0;
  expectRejected(config, "model.layers must be at least 1");
  config = withKind("gpt");
  config.heads = 0;
  expectRejected(config, "model.heads must be at least 1");
  config = withKind("gpt");
  config.context = -3;
  expectRejected(config, "model.context");
  config = withKind("gpt");
  config.vocab = 0;
  expectRejected(config, "model.vocab");
  config = withKind("gpt");
  config.dropout = 1.0;
  expectRejected(config, "model.dropout must be in [0, 1)");
}

TEST(ModelConfigTest, ImageFieldsAreChecked) {
  ModelConfig config = withKind("mlp");
  config.classes = 1;
  expectRejected(config, "model.classes must be at least 2");
  config = withKind("mlp");
  config.hidden = {64, 0};
  expectRejected(config, "model.hidden");
  config = withKind("mlp");
  config.input_shape = {};
  expectRejected(config, "model.input_shape must not be empty");
  config = withKind("cnn");
  config.input_shape = {28, 28};
  expectRejected(config, "model.input_shape must be {channels, height, width}");
  config = withKind("cnn");
  config.input_shape = {1, 0, 28};
  expectRejected(config, "model.input_shape must have positive dimensions");
  config = withKind("cnn");
  config.channels = 12;
  expectRejected(config, "model.channels (12) must be divisible by model.groups (8)");
  config = withKind("cnn");
  config.blocks = -1;
  expectRejected(config, "model.blocks");
  config = withKind("cnn");
  config.channels = 0;
  expectRejected(config, "model.channels must be at least 1");
}

TEST(ModelConfigTest, OnlyTheChosenKindsFieldsAreChecked) {
  // A CNN does not care that the (unused) GPT fields are inconsistent, and vice versa.
  ModelConfig config = withKind("cnn");
  config.width = 130;
  EXPECT_NO_THROW(validateModelConfig(config));
  config = withKind("gpt");
  config.input_shape = {28, 28};
  config.channels = 12;
  EXPECT_NO_THROW(validateModelConfig(config));
}

TEST(ModelConfigTest, ModelConstructorsRejectOtherKinds) {
  EXPECT_THROW(Cnn(withKind("gpt"), 0), ConfigError);
  EXPECT_THROW(Gpt(withKind("mlp"), 0), ConfigError);
}

}  // namespace
}  // namespace chorus::model
