// One plan, end to end: the front end reads the job file once and hands the workers the job and
// its Plan through the store; `chorus plan --out` writes a plan that `chorus train --plan` runs
// as it is.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/chorus_cli.h"
#include "runtime/job_fixtures.h"

namespace {

using chorus::testing::chorusTrain;
using chorus::testing::expectRefused;
using chorus::testing::runCommand;
using chorus::testing::TrainRun;

using chorus::runtime::testing::jobStart;
using chorus::runtime::testing::mlpOnSynthetic;

const std::string kJob = jobStart({.devices = "cpu,cpu@0.5"}, {.steps = 4,
                                                               .global_batch = 48,
                                                               .eval_every = 0,
                                                               .eval_samples = 64,
                                                               .target_accuracy = 0}) +
                         mlpOnSynthetic({.hidden = "[32]", .size = 512});

std::string writeFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::trunc) << text;
  return path;
}

// Starts `chorus train JOB`, deletes JOB as soon as the front end has logged its plan (it read the
// file before), and returns everything printed and the exit code.
chorus::testing::CommandResult trainDeletingTheJobFile(const std::string& job,
                                                       const std::string& log) {
  chorus::testing::CommandResult result;
  const std::string command =
      std::string(CHORUS_BINARY) + " train " + job + " --log-json " + log + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return result;
  std::array<char, 4096> line;
  while (fgets(line.data(), line.size(), pipe) != nullptr) {
    result.output += line.data();
    if (result.output.find("chorus train: plan: ") != std::string::npos) std::remove(job.c_str());
  }
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

TEST(JobPlanMultiproc, WorkersNeedOnlyThePlanNotTheJobFile) {
  const std::string job = writeFile("deleted_job.toml", kJob);
  const std::string log = ::testing::TempDir() + "/deleted_job.jsonl";
  const auto run = trainDeletingTheJobFile(job, log);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(access(job.c_str(), F_OK), 0) << "the job file was not deleted";
  EXPECT_NE(run.output.find("chorus train: plan: data parallel on cpu, cpu@0.5: shares 32/16"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("done: 4 steps"), std::string::npos) << run.output;
}

// The plan `chorus plan --out` writes for this node's devices, as JSON.
nlohmann::json planFor(const std::string& job, const std::string& devices,
                       const std::string& name) {
  const std::string cluster = ::testing::TempDir() + "/" + name + "_cluster.toml";
  const std::string plan = ::testing::TempDir() + "/" + name + "_plan.json";
  const auto measured = runCommand(std::string(CHORUS_BINARY) + " devices --quick --devices " +
                                   devices + " --cluster-toml " + cluster);
  EXPECT_EQ(measured.exit_code, 0) << measured.output;
  // Priced as given (rank i on device i, fp32), so that the plan uses both devices.
  const auto planned =
      runCommand(std::string(CHORUS_BINARY) + " plan --cluster " + cluster + " --model " + job +
                 " --global-batch 48 --shares 24,24 --precision fp32 --out " + plan);
  EXPECT_EQ(planned.exit_code, 0) << planned.output;
  std::ifstream in(plan);
  return nlohmann::json::parse(in);
}

TEST(JobPlanMultiproc, TrainRunsAPlanFileAsItIs) {
  const std::string job = writeFile("plan_file_job.toml", "balance = \"off\"\n" + kJob);
  nlohmann::json plan = planFor(job, "cpu,cpu@0.5", "plan_file");
  ASSERT_EQ(plan["replicas"].size(), 2u) << plan.dump();
  // Shares the planner would not choose, so that running them shows the file was followed.
  plan["replicas"][0]["share"] = 15;
  plan["replicas"][0]["stages"][0]["micro_batch"] = 15;
  plan["replicas"][1]["share"] = 33;
  plan["replicas"][1]["stages"][0]["micro_batch"] = 11;
  // Rank r of the run is replica r's, whatever numbers the planner gave its ranks.
  std::vector<std::string> devices;
  for (const auto& replica : plan["replicas"])
    devices.push_back(plan["ranks"][replica["stages"][0]["rank"].get<int>()]["device_type"]);
  const std::string path = writeFile("plan_file.json", plan.dump(1));
  const TrainRun run = chorusTrain(job + " --plan " + path, "plan_file");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("chorus train: plan: data parallel on " + devices[0] + ", " +
                            devices[1] + ": shares 15/33, micro-batches 15/11"),
            std::string::npos)
      << run.output;
  ASSERT_EQ(run.steps.size(), 4u) << run.output;
  for (const auto& step : run.steps)
    EXPECT_EQ(step["shares"].get<std::vector<int>>(), (std::vector<int>{15, 33}));
}

// The documented path (docs/planner.md, "Planning the local node"): `chorus devices
// --cluster-toml`, then the planner's own search (`chorus plan --out`, no shares given), then
// `chorus train --plan` on the job it planned for, whatever the planner chose (on this host: one
// device alone for this small MLP, ZeRO-2 over both for examples/default.toml's CNN).
TEST(JobPlanMultiproc, TrainRunsThePlannersOwnSearch) {
  const std::string job = writeFile("plan_search_job.toml", kJob);
  const std::string cluster = ::testing::TempDir() + "/plan_search_cluster.toml";
  const std::string path = ::testing::TempDir() + "/plan_search.json";
  const auto measured =
      runCommand(std::string(CHORUS_BINARY) +
                 " devices --quick --devices cpu,cpu@0.5 --cluster-toml " + cluster);
  ASSERT_EQ(measured.exit_code, 0) << measured.output;
  const auto planned = runCommand(std::string(CHORUS_BINARY) + " plan --cluster " + cluster +
                                  " --model " + job + " --global-batch 48 --out " + path);
  ASSERT_EQ(planned.exit_code, 0) << planned.output;
  const TrainRun run = chorusTrain(job + " --plan " + path, "plan_search");
  ASSERT_EQ(run.exit_code, 0) << planned.output << run.output;
  EXPECT_EQ(run.steps.size(), 4u) << run.output;
}

// The plan's ZeRO stage is the plan's to decide, as its shares are: a job that does not set
// zero.stage runs it (the documented path once ended in "set [zero] to match"), and one that sets
// another stage is told which of the two decides.
TEST(JobPlanMultiproc, TrainRunsThePlansZeroStage) {
  const std::string job = writeFile("plan_zero_job.toml", kJob);
  nlohmann::json plan = planFor(job, "cpu,cpu@0.5", "plan_zero");
  ASSERT_EQ(plan["replicas"].size(), 2u) << plan.dump();
  plan["zero_stage"] = 2;
  plan["zero_shards"] = nlohmann::json::array({0.5, 0.5});
  const std::string path = writeFile("plan_zero.json", plan.dump(1));
  const TrainRun run = chorusTrain(job + " --plan " + path, "plan_zero");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(run.steps.size(), 4u) << run.output;
  EXPECT_NE(run.output.find("ZeRO-2"), std::string::npos) << run.output;
  expectRefused(chorusTrain(job + " --set zero.stage=0 --plan " + path, "plan_clash"),
                "config key 'zero.stage': the plan runs ZeRO stage 2, the job says 0");
}

// The engines synchronize gradients as the plan says, not as the job's [comm] defaults would: a
// plan file that compresses with bf16 trains another trajectory than the same plan without a
// codec (bf16 rounds every gradient), and a job that writes another codec is told which decides.
TEST(JobPlanMultiproc, TrainRunsThePlansCodec) {
  const std::string job = writeFile("plan_comm_job.toml", kJob);
  nlohmann::json plan = planFor(job, "cpu,cpu@0.5", "plan_comm");
  ASSERT_EQ(plan["replicas"].size(), 2u) << plan.dump();
  const std::string plain = writeFile("plan_plain.json", plan.dump(1));
  plan["comm"]["inter_node_codec"] = "bf16";
  plan["comm"]["bucket_mb"] = 0.01;
  const std::string bf16 = writeFile("plan_bf16.json", plan.dump(1));
  const TrainRun exact = chorusTrain(job + " --set balance=off --plan " + plain, "plan_plain");
  const TrainRun rounded = chorusTrain(job + " --set balance=off --plan " + bf16, "plan_bf16");
  ASSERT_EQ(exact.exit_code, 0) << exact.output;
  ASSERT_EQ(rounded.exit_code, 0) << rounded.output;
  ASSERT_EQ(exact.steps.size(), 4u) << exact.output;
  ASSERT_EQ(rounded.steps.size(), 4u) << rounded.output;
  // Step 1's loss comes before any update; the updates after it differ.
  EXPECT_EQ(exact.steps[0]["loss"], rounded.steps[0]["loss"]);
  EXPECT_NE(exact.steps[3]["loss"], rounded.steps[3]["loss"]) << rounded.output;
  expectRefused(chorusTrain(job + " --set comm.compression=fp16 --plan " + bf16, "plan_comm_clash"),
                "config key 'comm.compression': the plan runs bf16, the job says fp16");
}

TEST(JobPlanMultiproc, APlanForOtherDevicesIsAConfigErrorNamingBoth) {
  const std::string job = writeFile("plan_mismatch_job.toml", kJob);
  const std::string path =
      writeFile("plan_mismatch.json", planFor(job, "cpu,cpu@0.5", "plan_mismatch").dump(1));
  const TrainRun run = chorusTrain(job + " --set devices=cpu,cpu --plan " + path, "plan_mismatch");
  expectRefused(run, "was planned for device 'cpu@0.5', but device 1 of this job is 'cpu'");
  EXPECT_TRUE(run.steps.empty());
}

}  // namespace
