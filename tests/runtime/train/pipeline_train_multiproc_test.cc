// `chorus train` with a pipeline end to end: the example job on two emulated devices of unlike
// speed, real worker processes through the agent, the JSON log.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chorus_version.h"

#include "runtime/chorus_cli.h"

namespace {

using chorus::testing::chorusTrain;
using chorus::testing::expectSays;
using chorus::testing::TrainRun;

const std::string kExample = std::string(CHORUS_SOURCE_DIR) + "/examples/gpt-pipeline.toml";

double meanLoss(const std::vector<nlohmann::json>& steps, size_t first, size_t count) {
  double total = 0;
  for (size_t i = first; i < first + count; ++i) total += steps.at(i)["loss"].get<double>();
  return total / static_cast<double>(count);
}

TEST(PipelineTrainMultiproc, ExampleTrainsOnUnlikeDevicesAndLogsEveryRank) {
  constexpr int kSteps = 24;
  const TrainRun run = chorusTrain(kExample + " --steps " + std::to_string(kSteps) +
                                       " --set train.eval_every=12 --set train.eval_samples=64",
                                   "pipeline_example");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  ASSERT_EQ(run.steps.size(), static_cast<size_t>(kSteps)) << run.output;
  expectSays(run, "pipeline 2 stages x 1 replica (1f1b, 8 micro-batches, layers ");
  // The front end's plan, logged before the workers start, is the one they run.
  expectSays(run, "chorus train: plan: 1 pipeline x 2 stages on cpu, cpu@0.4: ");
  expectSays(run, "pipeline: 2 stages x 1 replica(s)");
  for (size_t i = 0; i < run.steps.size(); ++i) {
    const auto& step = run.steps[i];
    EXPECT_EQ(step["step"].get<int>(), static_cast<int>(i) + 1);
    // One entry per rank: both ranks run the one replica's 32 samples.
    EXPECT_EQ(step["shares"], nlohmann::json::array({32, 32})) << step.dump();
    ASSERT_EQ(step["compute_s"].size(), 2u);
    EXPECT_GT(step["compute_s"][0].get<double>(), 0.0);
    EXPECT_GT(step["compute_s"][1].get<double>(), 0.0);
    EXPECT_EQ(step["wait_s"].size(), 2u);
  }
  EXPECT_TRUE(run.steps[11].contains("test_accuracy"));
  EXPECT_FALSE(run.steps[10].contains("test_accuracy"));
  // Character-level loss starts near ln(vocab) and falls within a few dozen steps.
  EXPECT_LT(meanLoss(run.steps, kSteps - 4, 4), meanLoss(run.steps, 0, 4) - 0.1) << run.output;
  expectSays(run, "done: 24 steps");
}

// Activation checkpointing recomputes each range's forward in the backward; with dropout the
// recompute must draw the masks of the original forward (the generators' states are restored for
// it, as torch.utils.checkpoint does) and must not move the generators for later steps. Every
// mode then trains exactly as without checkpointing.
TEST(PipelineTrainMultiproc, DropoutWithActivationCheckpointingTrainsAsWithout) {
  const std::string job = kExample +
                          " --set devices=cpu,cpu --set model.dropout=0.2 --set train.eval_every=0"
                          " --set train.eval_samples=32 --set optimizer.name=sgd"
                          " --set optimizer.lr=0.05 --set optimizer.warmup_steps=0 --steps 4";
  std::vector<std::vector<double>> losses;
  for (const char* mode : {"none", "stage", "layer"}) {
    const TrainRun run = chorusTrain(job + " --set parallel.activation_checkpointing=" + mode,
                                     std::string("pipeline_dropout_") + mode);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    ASSERT_EQ(run.steps.size(), 4u) << run.output;
    // The log names the mode that really ran.
    EXPECT_NE(run.output.find(std::string("checkpointing ") + mode), std::string::npos)
        << run.output;
    losses.emplace_back();
    for (const auto& step : run.steps) losses.back().push_back(step["loss"].get<double>());
  }
  for (size_t mode = 1; mode < losses.size(); ++mode)
    for (size_t step = 0; step < losses[0].size(); ++step)
      EXPECT_NEAR(losses[mode][step], losses[0][step], 1e-6 * losses[0][step])
          << "mode " << mode << ", step " << step;
}

// Evaluation sends each chunk's activation on while the stage computes the next, and holds at most
// two such sends. It used to hold every chunk's until the end: the whole test split's activations
// (26 MiB on the first stage here, where training peaks at 6 MiB), past the stage's budget.
TEST(PipelineTrainMultiproc, EvaluatesTheWholeTestSplitWithinATightBudget) {
  const TrainRun run = chorusTrain(
      "--set model.kind=gpt --set data.dataset=synthetic --set train.global_batch=24"
      " --set optimizer.name=sgd --set parallel.pipeline_stages=3 --set parallel.micro_batches=24"
      " --set parallel.partition=[2,2,2] --set devices=cpu/16MiB,cpu/64MiB,cpu/64MiB --steps 2",
      "pipeline_eval_budget");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  expectSays(run, "done: 2 steps");
  expectSays(run, "(whole test split)");
}

TEST(PipelineTrainMultiproc, BadParallelConfigIsRefusedBeforeAnythingStarts) {
  const TrainRun run = chorusTrain(kExample + " --set devices=cpu,cpu,cpu", "pipeline_bad");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  expectSays(run, "3 devices, but parallel.pipeline_stages (2)");
  EXPECT_EQ(run.output.find("chorus run:"), std::string::npos) << "workers were started";
}

}  // namespace
