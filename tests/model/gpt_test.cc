#include "chorus/model/gpt.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>
#include <torch/utils.h>

#include "chorus/core/error.h"

namespace chorus::model {
namespace {

ModelConfig gptConfig() {
  return {.kind = "gpt", .vocab = 20, .layers = 2, .width = 32, .heads = 4, .context = 16};
}

at::Tensor randomTokens(std::int64_t batch, std::int64_t length, std::int64_t vocab,
                        std::uint64_t seed) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(vocab, {batch, length}, generator, at::kLong);
}

TEST(GptTest, LogitsHaveOnePredictionPerPosition) {
  Gpt model(gptConfig(), 0);
  ASSERT_EQ(model.numLayers(), 4);
  const std::vector<LayerProfile> profile = model.profile();
  EXPECT_EQ(profile.front().name, "embed");
  EXPECT_EQ(profile[1].name, "block1");
  EXPECT_EQ(profile[2].name, "block2");
  EXPECT_EQ(profile.back().name, "head");
  torch::NoGradGuard no_grad;
  // Shorter sequences than the context are accepted.
  for (std::int64_t length : {1, 7, 16}) {
    const at::Tensor tokens = randomTokens(3, length, 20, 1);
    EXPECT_EQ(model.forwardRange(0, 1, tokens).sizes(), (at::IntArrayRef{3, length, 32}));
    EXPECT_EQ(model.forward(tokens).sizes(), (at::IntArrayRef{3, length, 20}));
  }
}

TEST(GptTest, ChangingATokenLeavesEarlierPositionsUnchanged) {
  Gpt model(gptConfig(), 2);
  torch::NoGradGuard no_grad;
  const at::Tensor tokens = randomTokens(2, 16, 20, 3);
  const at::Tensor before = model.forward(tokens);
  for (std::int64_t t : {0, 5, 15}) {
    at::Tensor changed = tokens.clone();
    changed.index_put_({0, t}, (tokens.index({0, t}) + 1).remainder(20));
    const at::Tensor after = model.forward(changed);
    // Masked positions get weight exactly 0, so earlier outputs match bit for bit.
    EXPECT_TRUE(at::equal(after.narrow(1, 0, t), before.narrow(1, 0, t))) << "t = " << t;
    EXPECT_FALSE(at::equal(after.narrow(1, t, 1), before.narrow(1, t, 1))) << "t = " << t;
    // The other sample of the batch is untouched.
    EXPECT_TRUE(at::equal(after[1], before[1]));
  }
}

TEST(GptTest, ProfileFollowsTheTransformerFormulas) {
  const ModelConfig config = gptConfig();
  Gpt model(config, 0);
  const std::vector<LayerProfile> profile = model.profile();
  const double t = 16, w = 32;
  const double block_flops =
      2 * t * w * 3 * w + 2 * t * t * w + 2 * t * t * w + 2 * t * w * w + 2 * t * w * 4 * w * 2;
  EXPECT_EQ(profile[0].forward_flops, 0.0);
  EXPECT_EQ(profile[1].forward_flops, block_flops);
  EXPECT_EQ(profile[2].forward_flops, block_flops);
  EXPECT_EQ(profile[3].forward_flops, 2 * t * w * 20);
  EXPECT_EQ(profile[0].parameters, (20 + 16) * 32);
  // Two LayerNorms, QKV, output projection and the two MLP linears, all with biases.
  EXPECT_EQ(profile[1].parameters, 12 * 32 * 32 + 13 * 32);
  EXPECT_EQ(profile[3].parameters, 2 * 32 + 32 * 20);
  EXPECT_EQ(profile[3].activation_bytes, 16 * 20 * 4);
  EXPECT_EQ(model.describe(),
            "gpt(layers=2, width=32, heads=4, context=16, vocab=20): 27.3 k parameters");
}

TEST(GptTest, LossSumIsSumOverSamplesOfMeanTokenCrossEntropy) {
  Gpt model(gptConfig(), 4);
  torch::NoGradGuard no_grad;
  const at::Tensor tokens = randomTokens(3, 10, 20, 5);
  const at::Tensor targets = randomTokens(3, 10, 20, 6);
  const at::Tensor logits = model.forward(tokens);
  double expected = 0;
  for (std::int64_t b = 0; b < 3; ++b) {
    const at::Tensor log_probs = logits[b].log_softmax(-1);
    double sample = 0;
    for (std::int64_t t = 0; t < 10; ++t)
      sample -= log_probs[t][targets[b][t].item<std::int64_t>()].item<double>();
    expected += sample / 10;
  }
  EXPECT_NEAR(model.lossSum(logits, targets).item<double>(), expected, 1e-5 * expected);
}

TEST(GptTest, LearnsARepeatedSequence) {
  // Next-token prediction on "0 1 2 … 7 0 1 2 …" from random starting points: every next token is
  // determined by the current one, so a few Adam steps must predict all of them.
  const ModelConfig config = gptConfig();
  Gpt model(config, 5);
  const std::int64_t batch = 8, length = 16, period = 8;
  const at::Tensor offsets = at::arange(batch, at::kLong).unsqueeze(1);
  const at::Tensor positions = at::arange(length + 1, at::kLong).unsqueeze(0);
  const at::Tensor sequence = (offsets + positions).remainder(period);
  const at::Tensor inputs = sequence.narrow(1, 0, length);
  const at::Tensor targets = sequence.narrow(1, 1, length);
  torch::optim::Adam optimizer(model.parameters(), torch::optim::AdamOptions(3e-3));
  double initial = 0;
  for (int step = 0; step < 40; ++step) {
    optimizer.zero_grad();
    const at::Tensor loss = model.lossSum(model.forward(inputs), targets) / batch;
    loss.backward();
    optimizer.step();
    if (step == 0) initial = loss.item<double>();
  }
  torch::NoGradGuard no_grad;
  const at::Tensor logits = model.forward(inputs);
  const double final_loss = model.lossSum(logits, targets).item<double>() / batch;
  EXPECT_LT(final_loss, 0.1 * initial) << "initial " << initial << ", final " << final_loss;
  EXPECT_EQ(model.correct(logits, targets), batch * length);
}

TEST(GptTest, RejectsBadTokenInputs) {
  Gpt model(gptConfig(), 0);
  EXPECT_THROW(model.forward(randomTokens(2, 17, 20, 0)), ConfigError);  // longer than context
  EXPECT_THROW(model.forward(at::zeros({2, 4})), ConfigError);           // floats, not ids
  EXPECT_THROW(model.forward(randomTokens(2, 4, 20, 0).unsqueeze(0)), ConfigError);
  const at::Tensor logits = model.forward(randomTokens(2, 4, 20, 0));
  EXPECT_THROW(model.lossSum(logits, randomTokens(2, 5, 20, 0)), ConfigError);
}

TEST(GptTest, DropoutIsActiveOnlyInTraining) {
  ModelConfig config = gptConfig();
  config.dropout = 0.5;
  Gpt model(config, 0);
  const at::Tensor tokens = randomTokens(2, 8, 20, 9);
  torch::NoGradGuard no_grad;
  EXPECT_FALSE(at::equal(model.forward(tokens), model.forward(tokens)));
  model.eval();
  EXPECT_TRUE(at::equal(model.forward(tokens), model.forward(tokens)));
}

}  // namespace
}  // namespace chorus::model
