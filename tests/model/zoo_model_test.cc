// Properties every zoo model keeps, checked on a small instance of each kind: the ones data and
// pipeline parallelism rely on (exact layer composition, additive loss, seed-only initialization)
// and the ones the planner relies on (profile parameters and activation sizes match the model).
#include "chorus/model/zoo_model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <cmath>
#include <string>
#include <utility>

#include "chorus/core/error.h"
#include "chorus/model/model_config.h"

namespace chorus::model {
namespace {

constexpr std::uint64_t kSeed = 1234;

ModelConfig smallConfig(const std::string& kind) {
  ModelConfig config;
  config.kind = kind;
  config.input_shape = {1, 10, 10};
  config.classes = 4;
  config.hidden = {24, 16};
  config.channels = 8;
  config.blocks = 2;
  config.groups = 4;
  config.vocab = 16;
  config.layers = 2;
  config.width = 32;
  config.heads = 4;
  config.context = 12;
  return config;
}

// A fixed batch of `batch` samples for `config`: random images with random labels, or random
// token sequences of full context length with random next tokens.
std::pair<at::Tensor, at::Tensor> makeBatch(const ModelConfig& config, std::int64_t batch,
                                            std::uint64_t seed) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  if (config.kind == "gpt") {
    at::Tensor tokens = at::randint(config.vocab, {batch, config.context}, generator, at::kLong);
    at::Tensor targets = at::randint(config.vocab, {batch, config.context}, generator, at::kLong);
    return {tokens, targets};
  }
  std::vector<std::int64_t> shape = {batch};
  shape.insert(shape.end(), config.input_shape.begin(), config.input_shape.end());
  at::Tensor images = at::randn(shape, generator);
  at::Tensor labels = at::randint(config.classes, {batch}, generator, at::kLong);
  return {images, labels};
}

class ZooModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  ModelConfig config_ = smallConfig(GetParam());
};

TEST_P(ZooModelTest, ProfileParametersSumToModelTotal) {
  const auto model = makeModel(config_, kSeed);
  std::int64_t total = 0;
  for (const at::Tensor& parameter : model->parameters()) total += parameter.numel();
  std::int64_t summed = 0;
  for (const LayerProfile& layer : model->profile()) {
    EXPECT_GT(layer.parameters, 0) << layer.name;
    summed += layer.parameters;
  }
  EXPECT_EQ(summed, total);
  EXPECT_EQ(model->parameterCount(), total);
  EXPECT_EQ(static_cast<std::int64_t>(model->profile().size()), model->numLayers());
}

TEST_P(ZooModelTest, ProfileActivationBytesMatchLayerOutputs) {
  const auto model = makeModel(config_, kSeed);
  const std::int64_t batch = 3;
  at::Tensor x = makeBatch(config_, batch, 1).first;
  const std::vector<LayerProfile> profile = model->profile();
  torch::NoGradGuard no_grad;
  for (std::int64_t i = 0; i < model->numLayers(); ++i) {
    x = model->forwardRange(i, i + 1, x);
    EXPECT_EQ(x.scalar_type(), at::kFloat);
    EXPECT_EQ(x.numel() / batch * 4, profile[static_cast<std::size_t>(i)].activation_bytes)
        << profile[static_cast<std::size_t>(i)].name;
  }
}

TEST_P(ZooModelTest, ForwardRangeComposesBitwiseAtEveryCut) {
  const auto model = makeModel(config_, kSeed);
  const at::Tensor x = makeBatch(config_, 4, 2).first;
  const std::int64_t layers = model->numLayers();
  torch::NoGradGuard no_grad;
  const at::Tensor whole = model->forward(x);
  for (std::int64_t a = 0; a <= layers; ++a) {
    for (std::int64_t b = a; b <= layers; ++b) {
      const at::Tensor staged =
          model->forwardRange(b, layers, model->forwardRange(a, b, model->forwardRange(0, a, x)));
      EXPECT_TRUE(at::equal(staged, whole)) << "cuts at " << a << " and " << b;
    }
  }
}

TEST_P(ZooModelTest, ForwardRangeRejectsRangesOutsideTheModel) {
  const auto model = makeModel(config_, kSeed);
  const at::Tensor x = makeBatch(config_, 1, 3).first;
  const std::int64_t layers = model->numLayers();
  EXPECT_THROW(model->forwardRange(-1, 1, x), ConfigError);
  EXPECT_THROW(model->forwardRange(2, 1, x), ConfigError);
  EXPECT_THROW(model->forwardRange(0, layers + 1, x), ConfigError);
  EXPECT_TRUE(at::equal(model->forwardRange(1, 1, x), x));
}

TEST_P(ZooModelTest, SameSeedGivesIdenticalParametersWhateverTheGlobalGenerator) {
  torch::manual_seed(1);
  const auto first = makeModel(config_, kSeed);
  torch::manual_seed(2);
  const auto second = makeModel(config_, kSeed);
  const auto third = makeModel(config_, kSeed + 1);
  const auto first_parameters = first->named_parameters();
  const auto second_parameters = second->named_parameters();
  const auto third_parameters = third->named_parameters();
  ASSERT_EQ(first_parameters.size(), second_parameters.size());
  std::size_t differing = 0;
  for (const auto& item : first_parameters) {
    EXPECT_TRUE(at::equal(item.value(), second_parameters[item.key()])) << item.key();
    // Constant-initialized tensors (norm scales and shifts, GPT biases) match across seeds.
    if (!at::equal(item.value(), third_parameters[item.key()])) ++differing;
  }
  EXPECT_GE(differing, static_cast<std::size_t>(first->numLayers()));
}

TEST_P(ZooModelTest, BatchLossSumEqualsSumOfPerSampleLosses) {
  const auto model = makeModel(config_, kSeed);
  const std::int64_t batch = 6;
  const auto [inputs, targets] = makeBatch(config_, batch, 4);
  torch::NoGradGuard no_grad;
  const double whole = model->lossSum(model->forward(inputs), targets).item<double>();
  double summed = 0;
  for (std::int64_t i = 0; i < batch; ++i) {
    const at::Tensor one = inputs.narrow(0, i, 1);
    summed += model->lossSum(model->forward(one), targets.narrow(0, i, 1)).item<double>();
  }
  EXPECT_NEAR(whole, summed, 1e-5 * std::abs(summed));
  // And uneven splits, as ranks of uneven data parallelism take them: 1 + 2 + 3 samples.
  double split = 0;
  for (const auto& [start, length] : {std::pair<int, int>{0, 1}, {1, 2}, {3, 3}})
    split += model
                 ->lossSum(model->forward(inputs.narrow(0, start, length)),
                           targets.narrow(0, start, length))
                 .item<double>();
  EXPECT_NEAR(whole, split, 1e-5 * std::abs(summed));
}

TEST_P(ZooModelTest, LossDecreasesUnderSgdOnAFixedBatch) {
  const auto model = makeModel(config_, kSeed);
  const std::int64_t batch = 8;
  const auto [inputs, targets] = makeBatch(config_, batch, 5);
  // Small enough a step for all three kinds: the CNN diverges at 0.05 on some batches.
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.03).momentum(0.9));
  double initial = 0;
  double last = 0;
  for (int step = 0; step < 30; ++step) {
    optimizer.zero_grad();
    const at::Tensor loss = model->lossSum(model->forward(inputs), targets) / batch;
    loss.backward();
    optimizer.step();
    if (step == 0) initial = loss.item<double>();
    last = loss.item<double>();
  }
  EXPECT_LT(last, 0.5 * initial) << "initial " << initial << ", final " << last;
}

TEST_P(ZooModelTest, CorrectCountsAgreeWithArgmax) {
  const auto model = makeModel(config_, kSeed);
  const auto [inputs, targets] = makeBatch(config_, 5, 6);
  torch::NoGradGuard no_grad;
  const at::Tensor outputs = model->forward(inputs);
  // Targets set to the predictions are all correct; shifted by one class, none is.
  const at::Tensor predicted = outputs.argmax(-1);
  const std::int64_t classes = outputs.size(-1);
  EXPECT_EQ(model->correct(outputs, predicted), predicted.numel());
  EXPECT_EQ(model->correct(outputs, (predicted + 1).remainder(classes)), 0);
}

TEST_P(ZooModelTest, DescribeNamesTheKindAndParameterCount) {
  const auto model = makeModel(config_, kSeed);
  const std::string text = model->describe();
  EXPECT_EQ(text.rfind(config_.kind + "(", 0), 0u) << text;
  EXPECT_NE(text.find(" parameters"), std::string::npos) << text;
}

INSTANTIATE_TEST_SUITE_P(Kinds, ZooModelTest, ::testing::Values("mlp", "cnn", "gpt"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace chorus::model
