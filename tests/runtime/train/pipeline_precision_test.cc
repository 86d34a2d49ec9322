// Per-stage precision in pipelines, run by the Trainer on threads over one in-memory store: a
// pipeline whose stages compute in bf16 and fp16 trains the GPT to the loss curve of fp32 within
// the noise that a data-parallel job of the same two formats shows; an overflow injected on one
// stage skips the step on every stage and replica and backs off the fp16 stages' scales; resume
// restores the stages' loss scales and their codec's memory bitwise.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <mutex>

#include "chorus/runtime/checkpoint/checkpoint.h"

#include "runtime/job_fixtures.h"
#include "runtime/trainer_threads.h"

namespace chorus::runtime {
namespace {

// The GPT of pipeline_trainer_test, at a learning rate where 16-bit rounding shows in the loss.
// The fp16 rank starts at a scale of 2^10: the default 2^16 overflows in the first steps and
// skips them, which would compare skipped steps rather than precision.
const std::string kJob =
    testing::jobStart({.seed = 3, .balance = "off"},
                      {.steps = 12, .global_batch = 32, .eval_every = 0}) +
    testing::kTinyGpt +
    testing::optimizerTable({.name = "sgd", .lr = 0.05, .momentum = 0.9, .warmup_steps = 2}) +
    R"([precision.loss_scale]
init = 1024.0
)";
const std::string kPipelineJob = std::string(kJob) + "[parallel]\nmicro_batches = 4\n";
constexpr std::int64_t kSteps = 12;

// Each step's loss (rank 0's record) of a job of `world` ranks.
std::vector<double> lossCurve(const std::string& toml, const std::vector<std::string>& settings,
                              int world) {
  std::vector<double> losses;
  const auto errors = testing::runTrainers(toml, settings, world, [&](Trainer& trainer, int rank) {
    for (std::int64_t step = 0; step < kSteps; ++step) {
      const StepRecord record = trainer.step();
      EXPECT_FALSE(record.skipped) << "step " << step;
      if (rank == 0) losses.push_back(record.loss);
    }
  });
  for (const auto& error : errors) EXPECT_EQ(error, "");
  return losses;
}

double largestGap(const std::vector<double>& a, const std::vector<double>& b) {
  double gap = 0;
  for (size_t i = 0; i < a.size(); ++i) gap = std::max(gap, std::abs(a[i] - b[i]));
  return gap;
}

TEST(PipelinePrecision, Bf16AndFp16StagesTrainWithinTheNoiseOfADataParallelMixedJob) {
  const std::vector<double> fp32 = lossCurve(kJob, {"devices=cpu,cpu"}, 2);
  const std::vector<double> data_parallel =
      lossCurve(kJob, {"devices=cpu,cpu", R"(precision.ranks=["bf16","fp16"])"}, 2);
  const std::vector<std::string> pipeline = {"devices=cpu,cpu", "parallel.pipeline_stages=2",
                                             R"(precision.ranks=["bf16","fp16"])"};
  const std::vector<double> mixed = lossCurve(kPipelineJob, pipeline, 2);
  const std::vector<double> fp32_pipeline =
      lossCurve(kPipelineJob, {"devices=cpu,cpu", "parallel.pipeline_stages=2"}, 2);
  ASSERT_EQ(mixed.size(), fp32.size());
  ASSERT_LT(fp32.back(), fp32.front() - 0.2);  // it trained: the curves mean something
  const double noise = largestGap(data_parallel, fp32);
  const double gap = largestGap(mixed, fp32);
  std::printf(
      "largest loss gap to fp32 over %lld steps: data-parallel bf16/fp16 %.3g, pipeline "
      "bf16/fp16 stages %.3g, fp32 pipeline %.3g\n",
      static_cast<long long>(kSteps), noise, gap, largestGap(fp32_pipeline, fp32));
  // The stages really computed in 16 bits (an fp32 pipeline is within 1e-5 of fp32) ...
  EXPECT_GT(gap, 20 * largestGap(fp32_pipeline, fp32) + 1e-6);
  // ... and drifted from fp32 no more than mixed data parallelism does.
  EXPECT_LT(gap, 2 * noise);
}

TEST(PipelinePrecision, AnOverflowOnOneStageSkipsTheStepOnEveryStageAndReplica) {
  constexpr std::int64_t kInjected = 4;
  constexpr int kWorld = 4;
  std::mutex mutex;
  // [rank][step]: parameters after the step, and the records.
  std::vector<std::vector<std::vector<at::Tensor>>> after(kWorld);
  std::vector<std::vector<StepRecord>> records(kWorld);
  const std::vector<std::string> settings = {"devices=cpu,cpu,cpu,cpu",
                                             "parallel.pipeline_stages=2", "parallel.replicas=2",
                                             R"(precision.ranks=["fp32","fp16","bf16","fp16"])"};
  const auto errors =
      testing::runTrainers(kPipelineJob, settings, kWorld, [&](Trainer& trainer, int rank) {
        TrainerHooks hooks;
        // Stage 0 of replica 1 (bf16): no loss scale of its own, so only consensus skips the
        // others.
        hooks.inject_overflow = [rank](std::int64_t step) {
          return rank == 2 && step == kInjected;
        };
        for (std::int64_t step = 0; step < 7; ++step) {
          const StepRecord record = trainer.step(hooks);
          std::lock_guard<std::mutex> lock(mutex);
          records[rank].push_back(record);
          after[rank].push_back(testing::stageParametersOf(trainer));
        }
      });
  for (const auto& error : errors) ASSERT_EQ(error, "");
  for (int rank = 0; rank < kWorld; ++rank) {
    for (std::int64_t step = 0; step < 7; ++step)
      EXPECT_EQ(records[rank][step].skipped, step == kInjected) << "rank " << rank << " " << step;
    // The skipped step left every stage's parameters as they were; the next one moved them.
    EXPECT_TRUE(testing::bitwiseEqual(after[rank][kInjected], after[rank][kInjected - 1])) << rank;
    EXPECT_FALSE(testing::bitwiseEqual(after[rank][kInjected + 1], after[rank][kInjected])) << rank;
  }
  // Both fp16 stages backed off together; fp32 and bf16 stages have no scale.
  const std::vector<double>& before = records[0][kInjected].loss_scales;
  const std::vector<double>& later = records[0][kInjected + 1].loss_scales;
  EXPECT_EQ(before, (std::vector<double>{0, 1024, 0, 1024}));
  EXPECT_EQ(later, (std::vector<double>{0, 512, 0, 512}));
  // The replicas still hold bitwise the same stages.
  EXPECT_TRUE(testing::bitwiseEqual(after[0].back(), after[2].back()));
  EXPECT_TRUE(testing::bitwiseEqual(after[1].back(), after[3].back()));
}

// Trains 2 replicas x 2 stages (fp16 stages, a bf16 codec with error feedback on the replicas'
// all-reduce, an overflow injected at step 1) to `steps`, resuming from `resume` when given, and
// checkpoints; returns every rank's stage parameters and its last loss scale.
std::pair<std::vector<std::vector<at::Tensor>>, std::vector<double>> trainAndCheckpoint(
    std::int64_t steps, const std::string& dir, bool resume) {
  std::vector<std::vector<at::Tensor>> parameters(4);
  std::vector<double> scales;
  std::mutex mutex;
  const std::vector<std::string> settings = {
      "devices=cpu,cpu,cpu,cpu", "parallel.pipeline_stages=2",
      "parallel.replicas=2",     R"(precision.ranks=["fp16","bf16","fp32","fp16"])",
      "comm.compression=bf16",   "checkpoint.dir=" + dir};
  const auto errors =
      testing::runTrainers(kPipelineJob, settings, 4, [&](Trainer& trainer, int rank) {
        if (resume) trainer.resume(resolveCheckpoint("latest", dir));
        TrainerHooks hooks;
        hooks.inject_overflow = [](std::int64_t step) { return step == 1; };
        std::vector<double> last_scales;
        while (trainer.nextStep() < steps) last_scales = trainer.step(hooks).loss_scales;
        trainer.checkpoint();
        std::lock_guard<std::mutex> lock(mutex);
        parameters[rank] = testing::stageParametersOf(trainer);
        if (rank == 0) scales = last_scales;
      });
  for (const auto& error : errors) EXPECT_EQ(error, "");
  return {parameters, scales};
}

TEST(PipelinePrecision, ResumeRestoresLossScalesAndCodecMemoryBitwise) {
  const std::string dir = ::testing::TempDir() + "/chorus_pipeline_precision_resume";
  std::filesystem::remove_all(dir);
  const auto straight = trainAndCheckpoint(8, dir + "/straight", false);
  trainAndCheckpoint(4, dir + "/split", false);
  const auto resumed = trainAndCheckpoint(8, dir + "/split", true);
  // The overflow at step 1 halved the fp16 stages' scales: a resume that forgot them would
  // start again at 1024.
  EXPECT_EQ(straight.second, (std::vector<double>{512, 0, 0, 512}));
  EXPECT_EQ(resumed.second, straight.second);
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_TRUE(testing::bitwiseEqual(resumed.first[rank], straight.first[rank]))
        << "rank " << rank;
}

}  // namespace
}  // namespace chorus::runtime
