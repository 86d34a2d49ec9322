#include "chorus/data/synthetic.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <numeric>
#include <thread>
#include <vector>

#include "chorus/core/error.h"

namespace chorus::data {
namespace {

TEST(SyntheticClassificationTest, SampleIsTheSameWhateverItIsFetchedWith) {
  const SyntheticClassification data(100, {3, 4, 4}, 10, 7);
  const Batch one = data.get({5});
  const Batch two = data.get({4, 5});
  EXPECT_TRUE(at::equal(one.inputs[0], two.inputs[1]));
  EXPECT_TRUE(at::equal(one.targets[0], two.targets[1]));
  const Batch reversed = data.get({5, 4});
  EXPECT_TRUE(at::equal(reversed.inputs[0], two.inputs[1]));
  EXPECT_TRUE(at::equal(reversed.inputs[1], two.inputs[0]));
  // Another instance with the same arguments (another rank) agrees.
  const SyntheticClassification again(100, {3, 4, 4}, 10, 7);
  EXPECT_TRUE(at::equal(again.get({4, 5}).inputs, two.inputs));
}

TEST(SyntheticClassificationTest, ShapesTypesAndRanges) {
  const SyntheticClassification data(50, {3, 4, 4}, 10, 7);
  EXPECT_EQ(data.size(), 50);
  EXPECT_EQ(data.sampleShape(), (std::vector<std::int64_t>{3, 4, 4}));
  EXPECT_EQ(data.numClasses(), 10);
  std::vector<std::int64_t> ids(50);
  std::iota(ids.begin(), ids.end(), 0);
  const Batch batch = data.get(ids);
  EXPECT_EQ(batch.inputs.sizes(), (std::vector<std::int64_t>{50, 3, 4, 4}));
  EXPECT_EQ(batch.inputs.scalar_type(), at::kFloat);
  EXPECT_EQ(batch.targets.scalar_type(), at::kLong);
  EXPECT_GE(batch.targets.min().item<std::int64_t>(), 0);
  EXPECT_LT(batch.targets.max().item<std::int64_t>(), 10);
  EXPECT_GE(batch.inputs.min().item<float>(), -2.0f);
  EXPECT_LT(batch.inputs.max().item<float>(), 2.0f);
  for (std::int64_t id = 0; id < 50; ++id)
    EXPECT_EQ(data.label(id), batch.targets[id].item<std::int64_t>());
}

TEST(SyntheticClassificationTest, SeedsGiveDifferentData) {
  const SyntheticClassification a(10, {8}, 4, 1);
  const SyntheticClassification b(10, {8}, 4, 2);
  EXPECT_FALSE(at::equal(a.get({0}).inputs, b.get({0}).inputs));
}

TEST(SyntheticClassificationTest, LabelsAreLearnable) {
  // A nearest-class-mean classifier fitted on 2,000 samples classifies new ones far above chance
  // (10%), so a model trained on this data can reduce its loss.
  const SyntheticClassification data(3000, {64}, 10, 3);
  std::vector<std::int64_t> train(2000), held_out(1000);
  std::iota(train.begin(), train.end(), 0);
  std::iota(held_out.begin(), held_out.end(), 2000);
  const Batch fit = data.get(train);
  at::Tensor means = at::zeros({10, 64});
  for (std::int64_t c = 0; c < 10; ++c) means[c] = fit.inputs.index({fit.targets == c}).mean(0);
  const Batch check = data.get(held_out);
  const at::Tensor predicted = at::cdist(check.inputs, means).argmin(1);
  const double accuracy = (predicted == check.targets).to(at::kDouble).mean().item<double>();
  EXPECT_GT(accuracy, 0.9);
  // Classes are drawn uniformly.
  const at::Tensor counts = at::bincount(fit.targets, {}, 10);
  EXPECT_GT(counts.min().item<std::int64_t>(), 140);
}

TEST(SyntheticClassificationTest, EmptyIdsAndBadArguments) {
  const SyntheticClassification data(10, {2, 3}, 4, 1);
  EXPECT_EQ(data.get({}).inputs.sizes(), (std::vector<std::int64_t>{0, 2, 3}));
  EXPECT_EQ(data.get({}).targets.sizes(), (std::vector<std::int64_t>{0}));
  EXPECT_THROW(data.get({10}), ConfigError);
  EXPECT_THROW(SyntheticClassification(-1, {2}, 4, 1), ConfigError);
  EXPECT_THROW(SyntheticClassification(10, {2, 0}, 4, 1), ConfigError);
  EXPECT_THROW(SyntheticClassification(10, {}, 4, 1), ConfigError);
  EXPECT_THROW(SyntheticClassification(10, {2}, 0, 1), ConfigError);
}

TEST(SyntheticClassificationTest, ConcurrentReadsAgree) {
  const SyntheticClassification data(1000, {32}, 10, 5);
  const std::vector<std::int64_t> ids = {1, 10, 100, 999};
  const Batch expected = data.get(ids);
  std::vector<int> same(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) same[t] += at::equal(data.get(ids).inputs, expected.inputs);
    });
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(same, std::vector<int>(4, 50));
}

TEST(SyntheticTokensTest, SampleIsTheSameWhateverItIsFetchedWith) {
  const SyntheticTokens data(100, 16, 50, 7);
  const Batch one = data.get({5});
  const Batch two = data.get({4, 5});
  EXPECT_TRUE(at::equal(one.inputs[0], two.inputs[1]));
  EXPECT_TRUE(at::equal(one.targets[0], two.targets[1]));
}

TEST(SyntheticTokensTest, TargetsAreInputsShiftedByOne) {
  const SyntheticTokens data(20, 16, 50, 7);
  EXPECT_EQ(data.sampleShape(), (std::vector<std::int64_t>{16}));
  EXPECT_EQ(data.numClasses(), 50);
  const Batch batch = data.get({0, 1, 2});
  EXPECT_EQ(batch.inputs.sizes(), (std::vector<std::int64_t>{3, 16}));
  EXPECT_EQ(batch.inputs.scalar_type(), at::kLong);
  EXPECT_TRUE(at::equal(batch.inputs.slice(1, 1), batch.targets.slice(1, 0, 15)));
  EXPECT_GE(batch.inputs.min().item<std::int64_t>(), 0);
  EXPECT_LT(batch.targets.max().item<std::int64_t>(), 50);
}

TEST(SyntheticTokensTest, NextTokenIsMostlyPredictable) {
  const SyntheticTokens data(500, 32, 50, 9);
  std::vector<std::int64_t> ids(500);
  std::iota(ids.begin(), ids.end(), 0);
  const Batch batch = data.get(ids);
  const auto* in = batch.inputs.data_ptr<std::int64_t>();
  const auto* out = batch.targets.data_ptr<std::int64_t>();
  std::int64_t follows = 0;
  for (std::int64_t k = 0; k < batch.inputs.numel(); ++k)
    follows += out[k] == data.successor(in[k]);
  // 3/4 follow the chain, plus 1/4 · 1/50 by chance.
  const double fraction = static_cast<double>(follows) / batch.inputs.numel();
  EXPECT_NEAR(fraction, 0.755, 0.02);
}

TEST(SyntheticTokensTest, BadArgumentsAreRejected) {
  EXPECT_THROW(SyntheticTokens(-1, 4, 10, 0), ConfigError);
  EXPECT_THROW(SyntheticTokens(10, 0, 10, 0), ConfigError);
  EXPECT_THROW(SyntheticTokens(10, 4, 0, 0), ConfigError);
  EXPECT_EQ(SyntheticTokens(10, 4, 10, 0).get({}).inputs.sizes(),
            (std::vector<std::int64_t>{0, 4}));
}

}  // namespace
}  // namespace chorus::data
