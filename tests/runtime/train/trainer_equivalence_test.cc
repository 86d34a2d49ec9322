// Invariant 1: placement never changes the math. Ranks run as threads over one in-memory store,
// each with its own share of every global batch (one accumulating over micro-batches); after 20
// steps their parameters must equal single-process training on the same global batches.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <stdexcept>

#include "runtime/job_fixtures.h"
#include "runtime/trainer_threads.h"

namespace chorus::runtime {
namespace {

const std::string kMlpJob =
    testing::jobStart({.seed = 7},
                      {.steps = 20, .global_batch = 64, .eval_every = 0, .eval_samples = 64}) +
    testing::mlpOnSynthetic({.hidden = "[32, 16]", .size = 2048}) +
    testing::optimizerTable({.name = "sgd", .lr = 0.1, .momentum = 0.9});

const std::string kGptJob =
    testing::jobStart({.seed = 3},
                      {.steps = 20, .global_batch = 64, .eval_every = 0, .eval_samples = 64}) +
    testing::kTinyGpt + testing::optimizerTable({.name = "sgd", .lr = 0.03, .momentum = 0.9});

// Rank 0's parameters after 20 steps of `toml` with the global batch split into `shares`, every
// rank accumulating over micro-batches of `micro_batch` samples (0: none); every rank must hold
// the same ones. The comparisons use testing::maxRelativeDifference, ||a - b|| / ||b|| (L2), so
// that zero-initialized tensors (biases) that moved only a little are measured on their own scale.
std::vector<at::Tensor> trainOnRanks(const std::string& toml,
                                     const std::vector<std::int64_t>& shares,
                                     std::int64_t micro_batch) {
  const int world = static_cast<int>(shares.size());
  std::string list;
  for (std::int64_t share : shares) list += (list.empty() ? "" : ",") + std::to_string(share);
  std::vector<std::vector<at::Tensor>> results(world);
  const auto errors = testing::runTrainers(
      toml, {"balancer.shares=[" + list + "]", "train.micro_batch=" + std::to_string(micro_batch)},
      world, [&](Trainer& trainer, int rank) {
        const std::vector<at::Tensor> initial = testing::parametersOf(trainer);
        for (int step = 0; step < 20; ++step) trainer.step();
        results[rank] = testing::parametersOf(trainer);
        // The steps changed the model: the comparison is not between untouched initializations.
        if (testing::maxRelativeDifference(results[rank], initial) < 1e-3)
          throw std::runtime_error("training changed nothing");
      });
  for (int rank = 0; rank < world; ++rank) EXPECT_EQ(errors[rank], "") << "rank " << rank;
  // Every rank holds the same replica.
  for (int rank = 1; rank < world; ++rank)
    for (size_t i = 0; i < results[0].size(); ++i)
      EXPECT_TRUE(at::equal(results[rank][i], results[0][i])) << "rank " << rank << " param " << i;
  return results[0];
}

void expectEquivalent(const std::string& toml, const std::vector<std::int64_t>& shares) {
  const auto reference = trainOnRanks(toml, {64}, 0);
  const auto parallel = trainOnRanks(toml, shares, 8);
  ASSERT_EQ(parallel.size(), reference.size());
  const double difference = testing::maxRelativeDifference(parallel, reference);
  std::printf("%zu ranks: max relative parameter difference after 20 steps: %.3g\n", shares.size(),
              difference);
  EXPECT_LT(difference, 1e-5);
}

TEST(TrainerEquivalence, MlpUnevenSharesMatchSingleProcess) {
  expectEquivalent(kMlpJob, {5, 17, 42});
}
TEST(TrainerEquivalence, GptUnevenSharesMatchSingleProcess) {
  expectEquivalent(kGptJob, {5, 17, 42});
}
TEST(TrainerEquivalence, MlpTwoRanks) { expectEquivalent(kMlpJob, {20, 44}); }
TEST(TrainerEquivalence, MlpFourRanksWithAZeroShare) { expectEquivalent(kMlpJob, {0, 16, 16, 32}); }
TEST(TrainerEquivalence, GptFourRanks) { expectEquivalent(kGptJob, {16, 16, 16, 16}); }

}  // namespace
}  // namespace chorus::runtime
