// `chorus train` with plan = "auto" end to end: the front end measures the devices, times the
// model, plans, logs the choice in one line, and the workers run exactly the planned split.
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/chorus_cli.h"

namespace {

using chorus::testing::chorusTrain;
using chorus::testing::TrainRun;

const std::string kSmallJob =
    " --set data.dataset=synthetic --set data.size=1024 --set train.eval_every=0"
    " --set train.eval_samples=64 --set train.target_accuracy=0 --set model.channels=16"
    " --set model.blocks=1 --set model.groups=4 --steps 3";

TEST(AutoPlanMultiproc, TrainRunsThePlannedSharesFromTheFirstStep) {
  const TrainRun run =
      chorusTrain("--set plan=auto --set devices=cpu@1.0,cpu@0.5" + kSmallJob, "auto_dp");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::string prefix = "chorus train: plan = auto: data parallel, shares ";
  const auto line = run.output.find(prefix);
  ASSERT_NE(line, std::string::npos) << run.output;
  EXPECT_NE(run.output.find("/step; best: ", line), std::string::npos) << run.output;
  // The CPU workers are priced with the model as timed on this host, not the defaults.
  EXPECT_NE(run.output.find("; calibrated on this host: ", line), std::string::npos) << run.output;
  int planned_fast = 0, planned_slow = 0;
  ASSERT_EQ(
      std::sscanf(run.output.c_str() + line + prefix.size(), "%d/%d", &planned_fast, &planned_slow),
      2)
      << run.output;
  ASSERT_EQ(run.steps.size(), 3u) << run.output;
  // Exactly the planned split, from the first step on; the timing sets where between the speeds'
  // 43/21 and the fixed costs' pull toward the faster worker it lies, so only its order is known.
  for (const auto& step : run.steps)
    EXPECT_EQ(step["shares"].get<std::vector<int>>(),
              (std::vector<int>{planned_fast, planned_slow}));
  EXPECT_EQ(planned_fast + planned_slow, 64);
  EXPECT_GT(planned_fast, planned_slow) << run.output;
  EXPECT_NE(run.output.find("done: 3 steps"), std::string::npos) << run.output;
}

// Budgets twice apart: replicated, the GPT with AdamW fits only the largest. The plan shards with
// ZeRO (sized by memory), predicted well ahead of the pipeline that also fits, and trains.
TEST(AutoPlanMultiproc, AJobThatFitsReplicatedOnlyOnOneDeviceTrainsSharded) {
  const TrainRun run = chorusTrain(
      "--set plan=auto --set devices=cpu/10MiB,cpu/20MiB,cpu/40MiB --set model.kind=gpt"
      " --set data.dataset=synthetic --set train.global_batch=24 --set optimizer.name=adamw"
      " --set train.eval_samples=48 --steps 3",
      "auto_zero");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto line = run.output.find("chorus train: plan = auto: data parallel with ZeRO-");
  ASSERT_NE(line, std::string::npos) << run.output;
  EXPECT_NE(run.output.find("; ZeRO: ZeRO-", line), std::string::npos) << run.output;
  EXPECT_EQ(run.steps.size(), 3u) << run.output;
  EXPECT_NE(run.output.find("done: 3 steps"), std::string::npos) << run.output;
}

TEST(AutoPlanMultiproc, AKeyThePlanSetsIsAConfigErrorBeforeAnythingStarts) {
  const TrainRun run =
      chorusTrain("--set plan=auto --set devices=cpu,cpu --set balancer.shares=[40,24]" + kSmallJob,
                  "auto_conflict");
  chorus::testing::expectRefused(run, "config key 'balancer.shares': plan = \"auto\" chooses it");
  EXPECT_TRUE(run.steps.empty());
}

}  // namespace
