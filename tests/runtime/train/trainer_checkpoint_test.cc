// Checkpoints of the Trainer: exact resume, resume on another device set, overflow consensus.
// Ranks run as threads over one in-memory store.
#include <gtest/gtest.h>

#include <array>
#include <filesystem>

#include "chorus/runtime/checkpoint/checkpoint.h"
#include "runtime/job_fixtures.h"
#include "runtime/trainer_threads.h"

namespace chorus::runtime {
namespace {

const std::string kJob =
    testing::jobStart({.seed = 11, .balance = "off"},
                      {.steps = 12, .global_batch = 48, .eval_every = 0, .eval_samples = 64}) +
    testing::mlpOnSynthetic({.hidden = "[32, 16]", .size = 1024}) +
    testing::optimizerTable({.name = "adamw", .lr = 0.01, .warmup_steps = 3});

std::string freshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/chorus_ckpt_" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

// Trains `steps` steps on `world` ranks (resuming from `resume` when given), checkpoints, and
// returns rank 0's parameters.
std::vector<at::Tensor> train(int world, std::int64_t steps, const std::string& dir,
                              const std::string& resume = "") {
  std::vector<at::Tensor> result;
  const auto errors =
      testing::runTrainers(kJob, {"checkpoint.dir=" + dir}, world, [&](Trainer& t, int rank) {
        if (!resume.empty()) t.resume(resolveCheckpoint(resume, dir));
        while (t.nextStep() < steps) t.step();
        t.checkpoint();
        if (rank == 0) result = testing::parametersOf(t);
      });
  for (const auto& error : errors) EXPECT_EQ(error, "");
  return result;
}

TEST(TrainerCheckpoint, ResumeOnTheSameRanksIsBitwiseExact) {
  const auto straight = train(3, 12, freshDir("straight"));
  const std::string dir = freshDir("interrupted");
  train(3, 5, dir);
  const auto resumed = train(3, 12, dir, "latest");
  ASSERT_FALSE(straight.empty());
  EXPECT_TRUE(testing::bitwiseEqual(resumed, straight))
      << "max relative difference " << testing::maxRelativeDifference(resumed, straight);
}

TEST(TrainerCheckpoint, ResumeFromThreeRanksOnTwoMatchesWithinReductionOrder) {
  const auto straight = train(3, 12, freshDir("straight3"));
  const std::string dir = freshDir("three_to_two");
  train(3, 5, dir);
  const auto resumed = train(2, 12, dir, "latest");
  const double difference = testing::maxRelativeDifference(resumed, straight);
  std::printf("3 ranks -> 2 ranks: max relative parameter difference %.3g\n", difference);
  EXPECT_LT(difference, 1e-5);
}

TEST(TrainerCheckpoint, ResumeRejectsACheckpointOfAnotherModel) {
  const std::string dir = freshDir("other_model");
  train(1, 2, dir);
  const auto errors =
      testing::runTrainers(kJob, {"checkpoint.dir=" + dir, "model.hidden=[24]"}, 1,
                           [&](Trainer& t, int) { t.resume(resolveCheckpoint("latest", dir)); });
  EXPECT_NE(errors[0].find("is of another job: the model was"), std::string::npos) << errors[0];
}

// Overflow consensus: an inf on one rank at step k makes every rank skip step k, the replicas
// stay bitwise identical, and the fp16 ranks back off their scale together.
TEST(TrainerPrecision, OverflowOnOneRankMakesEveryRankSkipTheStep) {
  constexpr std::int64_t kBad = 3;
  std::vector<std::vector<at::Tensor>> before(3), after(3), final(3);
  std::vector<std::vector<double>> scales(3);
  // One bool object per rank: the ranks are threads and write their own entry at the same time,
  // which std::vector<bool> (bits packed into one shared word, updated read-modify-write) would
  // turn into a data race that loses another rank's write.
  std::array<bool, 3> skipped{}, others_skipped{};
  const auto errors = testing::runTrainers(
      kJob, {"precision.ranks=[\"fp16\", \"fp16\", \"fp32\"]", "precision.loss_scale.init=256"}, 3,
      [&](Trainer& t, int rank) {
        TrainerHooks hooks;
        hooks.inject_overflow = [rank](std::int64_t step) { return rank == 1 && step == kBad; };
        for (std::int64_t step = 0; step < 6; ++step) {
          if (step == kBad) before[rank] = testing::parametersOf(t);
          const StepRecord record = t.step(hooks);
          if (step == kBad) {
            after[rank] = testing::parametersOf(t);
            skipped[rank] = record.skipped;
            scales[rank] = record.loss_scales;
            scales[rank].push_back(t.lossScale());
          } else if (record.skipped) {
            others_skipped[rank] = true;
          }
        }
        final[rank] = testing::parametersOf(t);
      });
  for (const auto& error : errors) ASSERT_EQ(error, "");
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(skipped[rank]) << "rank " << rank;
    EXPECT_FALSE(others_skipped[rank]) << "rank " << rank;
    EXPECT_TRUE(testing::bitwiseEqual(after[rank], before[rank])) << "rank " << rank << " stepped";
    EXPECT_TRUE(testing::bitwiseEqual(final[rank], final[0])) << "rank " << rank << " diverged";
    EXPECT_TRUE(testing::bitwiseEqual(after[rank], after[0])) << "rank " << rank << " diverged";
  }
  // The scales the step ran with, then this rank's after it: backed off.
  EXPECT_EQ(scales[0], (std::vector<double>{256.0, 256.0, 0.0, 128.0}));
  EXPECT_EQ(scales[2], (std::vector<double>{256.0, 256.0, 0.0, 0.0}));
}

// fp16 and bf16 ranks train the same model as fp32 ranks, closely: the master weights stay fp32.
TEST(TrainerPrecision, MixedFormatsTrainCloseToFp32) {
  auto trainWith = [](const std::string& ranks) {
    std::vector<at::Tensor> result;
    const auto errors =
        testing::runTrainers(kJob, {"precision.ranks=" + ranks, "precision.loss_scale.init=1024"},
                             2, [&](Trainer& t, int rank) {
                               while (t.nextStep() < 12) t.step();
                               if (rank == 0) result = testing::parametersOf(t);
                             });
    for (const auto& error : errors) EXPECT_EQ(error, "");
    return result;
  };
  const auto fp32 = trainWith("[\"fp32\", \"fp32\"]");
  const auto mixed = trainWith("[\"bf16\", \"fp16\"]");
  const double difference = testing::maxRelativeDifference(mixed, fp32);
  std::printf("bf16 + fp16 ranks vs fp32: max relative parameter difference %.3g\n", difference);
  EXPECT_GT(difference, 0.0);  // the formats really differ
  EXPECT_LT(difference, 0.05);
}

}  // namespace
}  // namespace chorus::runtime
