// Invariant 1: placement never changes the math. Ranks run as threads over one in-memory store,
// each with its own share of every global batch (one accumulating over micro-batches); after 20
// steps their parameters must equal single-process training on the same global batches.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <thread>

#include "chorus/comm/store/memory_store.h"
#include "chorus/core/config.h"
#include "chorus/model/zoo_model.h"
#include "chorus/runtime/job/job_config.h"
#include "chorus/runtime/train/trainer.h"
#include "runtime/job_fixtures.h"

namespace chorus::runtime {
namespace {

constexpr const char* kMlpJob = R"(
seed = 7
[train]
steps = 20
global_batch = 64
eval_every = 0
eval_samples = 64
[model]
kind = "mlp"
input_shape = [1, 8, 8]
hidden = [32, 16]
[data]
dataset = "synthetic"
size = 2048
[optimizer]
name = "sgd"
lr = 0.1
momentum = 0.9
)";

const std::string kGptJob = std::string(R"(
seed = 3
[train]
steps = 20
global_batch = 64
eval_every = 0
eval_samples = 64
)") + testing::kTinyGpt + R"([optimizer]
name = "sgd"
lr = 0.03
momentum = 0.9
)";

// The largest relative difference of any parameter tensor, ||a - b|| / ||b|| (L2), so that
// zero-initialized tensors (biases) that moved only a little are measured on their own scale.
double maxRelativeDifference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double scale = std::max(b[i].norm().item<double>(), 1e-12);
    worst = std::max(worst, (a[i] - b[i]).norm().item<double>() / scale);
  }
  return worst;
}

std::vector<at::Tensor> trainOnRanks(const std::string& toml,
                                     const std::vector<std::int64_t>& shares,
                                     std::int64_t micro_batch) {
  const int world = static_cast<int>(shares.size());
  auto store = std::make_shared<comm::MemoryStore>();
  std::vector<std::vector<at::Tensor>> results(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        Config config = Config::parseString(toml);
        std::string list;
        for (std::int64_t share : shares) list += (list.empty() ? "" : ",") + std::to_string(share);
        config.set("balancer.shares=[" + list + "]");
        config.set("train.micro_batch=" + std::to_string(micro_batch));
        const JobConfig job = readJobConfig(config);
        InitOptions options;
        options.environment = Environment{{"CHORUS_RANK", std::to_string(rank)},
                                          {"CHORUS_WORLD_SIZE", std::to_string(world)},
                                          {"CHORUS_RDZV_ENDPOINT", "127.0.0.1:1"},
                                          {"CHORUS_SECRET_FILE", "unused: the store is in memory"},
                                          {"CHORUS_LOG_LEVEL", "warn"}};
        options.store = store;
        Trainer trainer(job, init(options));
        std::vector<at::Tensor> initial;
        for (const auto& parameter : trainer.model().parameters())
          initial.push_back(parameter.detach().clone());
        for (int step = 0; step < 20; ++step) trainer.step();
        // The steps changed the model: the comparison is not between untouched initializations.
        std::vector<at::Tensor> trained;
        for (const auto& parameter : trainer.model().parameters())
          trained.push_back(parameter.detach().clone());
        if (maxRelativeDifference(trained, initial) < 1e-3)
          errors[rank] = "training changed nothing";
        results[rank] = trained;
      } catch (const std::exception& error) {
        errors[rank] = error.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
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
  const double difference = maxRelativeDifference(parallel, reference);
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
