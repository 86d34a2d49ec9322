// `chorus train` end to end: real worker processes through the agent, the JSON log, memory budgets.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/chorus_cli.h"

namespace {

using chorus::testing::chorusTrain;
using chorus::testing::TrainRun;

const std::string kSmallJob =
    " --set data.dataset=synthetic --set data.size=2048 --set train.steps=12"
    " --set train.eval_every=6 --set train.eval_samples=128 --set train.target_accuracy=0"
    " --set model.channels=16 --set model.blocks=1 --set model.groups=4";

TEST(TrainMultiproc, WritesOneJsonObjectPerStepWithSharesAndComputeTimes) {
  const TrainRun run = chorusTrain("--set devices=cpu,cpu@0.5" + kSmallJob, "json_log");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  ASSERT_EQ(run.steps.size(), 12u) << run.output;
  for (size_t i = 0; i < run.steps.size(); ++i) {
    const auto& step = run.steps[i];
    EXPECT_EQ(step["step"].get<int>(), static_cast<int>(i) + 1);
    EXPECT_EQ(step["shares"].size(), 2u);
    EXPECT_EQ(step["shares"][0].get<int>() + step["shares"][1].get<int>(), 64);
    EXPECT_EQ(step["compute_s"].size(), 2u);
    EXPECT_GT(step["samples_per_s"].get<double>(), 0.0);
    EXPECT_TRUE(step["loss"].is_number());
  }
  EXPECT_TRUE(run.steps[5].contains("test_accuracy"));
  EXPECT_FALSE(run.steps[4].contains("test_accuracy"));
  EXPECT_NE(run.output.find("done: 12 steps"), std::string::npos) << run.output;
}

// A budget that holds only a few samples: the rank accumulates over micro-batches, nothing runs
// out of memory, and the losses are those of the same job without a budget (the split of the
// work never changes the math).
TEST(TrainMultiproc, SmallMemoryBudgetIsRespectedWithoutChangingTheMath) {
  const TrainRun capped =
      chorusTrain("--set devices=cpu,cpu/2MiB --set balance=off" + kSmallJob, "capped");
  ASSERT_EQ(capped.exit_code, 0) << capped.output;
  EXPECT_NE(capped.output.find("memory budget 2 MiB: micro-batches of at most"), std::string::npos)
      << capped.output;
  EXPECT_EQ(capped.output.find("OutOfMemory"), std::string::npos) << capped.output;
  const TrainRun free = chorusTrain("--set devices=cpu,cpu --set balance=off" + kSmallJob, "free");
  ASSERT_EQ(free.exit_code, 0) << free.output;
  ASSERT_EQ(capped.steps.size(), free.steps.size());
  for (size_t i = 0; i < free.steps.size(); ++i)
    EXPECT_NEAR(capped.steps[i]["loss"].get<double>(), free.steps[i]["loss"].get<double>(),
                1e-4 * std::abs(free.steps[i]["loss"].get<double>()))
        << "step " << i + 1;
}

// A weak device beside a strong one: the first step already splits by the devices' speeds (not
// 32/32), and a device whose one sample makes it the straggler is left out, saying why. The
// margin is wide: cpu@0.01's one sample takes ~100x its real cost (~1 ms), the other's whole
// share a few ms.
TEST(TrainMultiproc, AWeakDeviceStartsAtItsSpeedsShareAndIsLeftOutWhenItOnlySlowsTheStep) {
  const TrainRun run = chorusTrain(
      "--set devices=cpu@1.0,cpu@0.01 --set train.eval_every=0" + kSmallJob, "weak_device");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  ASSERT_EQ(run.steps.size(), 12u) << run.output;
  EXPECT_EQ(run.steps[0]["shares"], nlohmann::json::parse("[63, 1]")) << run.output;
  EXPECT_EQ(run.steps.back()["shares"], nlohmann::json::parse("[64, 0]")) << run.output;
  EXPECT_NE(run.output.find("cpu@0.01 left out: its one sample takes"), std::string::npos)
      << run.output;
}

// cpu_threads reaches the worker's intra-op pool (the rank's world line reads it back from
// libtorch); an emulated device computes on one thread whatever the node leaves idle.
TEST(TrainMultiproc, ACpuComputesOnTheThreadsItsNodeGivesIt) {
  const TrainRun three = chorusTrain(
      "--set devices=cpu --set cpu_threads=3 --set train.eval_every=0" + kSmallJob, "threads");
  ASSERT_EQ(three.exit_code, 0) << three.output;
  EXPECT_NE(three.output.find("cpu computes on 3 threads (cpu_threads)"), std::string::npos)
      << three.output;
  EXPECT_NE(three.output.find("computes in fp32 on 3 thread(s)"), std::string::npos)
      << three.output;
  const TrainRun emulated =
      chorusTrain("--set devices=cpu@0.5 --set train.eval_every=0" + kSmallJob, "emulated_threads");
  ASSERT_EQ(emulated.exit_code, 0) << emulated.output;
  EXPECT_NE(emulated.output.find("computes in fp32 on 1 thread(s)"), std::string::npos)
      << emulated.output;
  const TrainRun negative = chorusTrain("--set cpu_threads=-1" + kSmallJob, "bad_threads");
  EXPECT_EQ(negative.exit_code, 2) << negative.output;
  EXPECT_NE(negative.output.find("cpu_threads"), std::string::npos) << negative.output;
}

TEST(TrainMultiproc, BadConfigIsRefusedBeforeAnythingStarts) {
  const TrainRun run = chorusTrain("--set optimizer.lr=fast" + kSmallJob, "bad");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("optimizer.lr"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("chorus run:"), std::string::npos) << "workers were started";
}

}  // namespace

// The CPU transport reaches the workers' communicators: Gloo and shared memory run the same job
// to the same losses (two ranks: a sum of two is the same in any order).
TEST(TrainMultiproc, CpuTransportIsPassedToTheWorkers) {
  const TrainRun gloo = chorusTrain(
      "--set devices=cpu,cpu --set balance=off --set comm.cpu_transport=gloo" + kSmallJob, "gloo");
  const TrainRun shm = chorusTrain(
      "--set devices=cpu,cpu --set balance=off --set comm.cpu_transport=shm" + kSmallJob, "shm");
  ASSERT_EQ(gloo.exit_code, 0) << gloo.output;
  ASSERT_EQ(shm.exit_code, 0) << shm.output;
  EXPECT_NE(gloo.output.find("CPU collectives over gloo"), std::string::npos) << gloo.output;
  EXPECT_NE(shm.output.find("CPU collectives over shm"), std::string::npos) << shm.output;
  ASSERT_EQ(gloo.steps.size(), shm.steps.size());
  for (size_t i = 0; i < shm.steps.size(); ++i)
    EXPECT_NEAR(gloo.steps[i]["loss"].get<double>(), shm.steps[i]["loss"].get<double>(),
                1e-6 * std::abs(shm.steps[i]["loss"].get<double>()))
        << "step " << i + 1;
  const TrainRun bad = chorusTrain("--set comm.cpu_transport=mpi" + kSmallJob, "bad_transport");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("comm.cpu_transport"), std::string::npos) << bad.output;
}
