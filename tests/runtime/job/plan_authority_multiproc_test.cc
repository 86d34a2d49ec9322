// One Plan, however it is made: plan = "auto" (the planner's Plan adopted as it is), `chorus plan
// --out` then `chorus train --plan`, and a job that writes the same split by hand run the same
// Plan (the front end's plan line, which describes every field the trainers read) and train the
// same model: the same first 20 losses, bit for bit.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "runtime/chorus_cli.h"
#include "runtime/job_fixtures.h"

namespace {

using chorus::testing::chorusTrain;
using chorus::testing::runCommand;
using chorus::testing::TrainRun;
using namespace chorus::runtime::testing;

constexpr int kSteps = 20;

// Two alike CPUs, shares fixed where the plan puts them (balance = off: measured speeds must
// not move them differently in the three runs).
std::string jobText(const std::string& first_lines) {
  return first_lines +
         jobStart({.devices = "cpu,cpu", .balance = "off"},
                  {.steps = kSteps, .global_batch = 48, .eval_every = 0, .target_accuracy = 0}) +
         mlpOnSynthetic({.hidden = "[32]", .size = 512});
}

std::string writeJob(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::trunc) << text;
  return path;
}

// The line the front end logs for the Plan it hands the workers.
std::string planLine(const TrainRun& run) {
  const std::string prefix = "chorus train: plan: ";
  const auto start = run.output.find(prefix);
  if (start == std::string::npos) return "";
  return run.output.substr(start, run.output.find('\n', start) - start);
}

std::vector<double> losses(const TrainRun& run) {
  std::vector<double> values;
  for (const auto& step : run.steps) values.push_back(step["loss"].get<double>());
  return values;
}

TEST(PlanAuthorityMultiproc, AutoPlanFileAndHandWrittenJobRunOnePlanAndOneTrajectory) {
  const TrainRun automatic =
      chorusTrain(writeJob("authority_auto.toml", jobText("plan = \"auto\"\n")), "authority_auto");
  ASSERT_EQ(automatic.exit_code, 0) << automatic.output;
  ASSERT_NE(automatic.output.find("chorus train: plan = auto: data parallel, shares 24/24"),
            std::string::npos)
      << automatic.output;

  // The documented path: measure the node, plan the job's model on it, run the plan file.
  const std::string job = writeJob("authority_job.toml", jobText(""));
  const std::string cluster = ::testing::TempDir() + "/authority_cluster.toml";
  const std::string plan = ::testing::TempDir() + "/authority_plan.json";
  const auto measured = runCommand(std::string(CHORUS_BINARY) +
                                   " devices --quick --devices cpu,cpu --cluster-toml " + cluster);
  ASSERT_EQ(measured.exit_code, 0) << measured.output;
  const auto planned =
      runCommand(std::string(CHORUS_BINARY) + " plan --cluster " + cluster + " --model " + job +
                 " --global-batch 48 --shares 24,24 --precision fp32 --out " + plan);
  ASSERT_EQ(planned.exit_code, 0) << planned.output;
  const TrainRun from_file = chorusTrain(job + " --plan " + plan, "authority_file");
  ASSERT_EQ(from_file.exit_code, 0) << from_file.output;

  const TrainRun by_hand =
      chorusTrain(writeJob("authority_hand.toml", jobText("") + "[balancer]\nshares = [24, 24]\n"),
                  "authority_hand");
  ASSERT_EQ(by_hand.exit_code, 0) << by_hand.output;

  const std::string line = planLine(automatic);
  EXPECT_EQ(line,
            "chorus train: plan: data parallel on cpu, cpu: shares 24/24, micro-batches "
            "24/24, precision fp32/fp32");
  EXPECT_EQ(planLine(from_file), line);
  EXPECT_EQ(planLine(by_hand), line);
  ASSERT_EQ(automatic.steps.size(), static_cast<size_t>(kSteps)) << automatic.output;
  EXPECT_EQ(losses(from_file), losses(automatic));
  EXPECT_EQ(losses(by_hand), losses(automatic));
}

}  // namespace
