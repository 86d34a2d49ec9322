// The heterogeneous point of ZeRO, with real worker processes and enforced memory budgets: three
// devices of unlike memory on which the GPT with AdamW fits neither replicated (stage 0) nor with
// even ZeRO-2 shards (the smallest device cannot hold a third of the state), each refused before
// any worker starts with a ConfigError naming the device; with shards sized by memory it trains,
// every worker inside its budget (the counting allocator raises OutOfMemoryError past it), and
// its losses are those of the same job with even shards on devices that fit it. Then the same for
// ZeRO-3 on devices three times apart, where only parameters sharded by memory fit.
#include <gtest/gtest.h>

#include <filesystem>

#include "runtime/chorus_cli.h"

namespace chorus::runtime {
namespace {

using chorus::testing::chorusTrain;

const std::string kJob =
    "--set model.kind=gpt --set data.dataset=synthetic --set data.size=1024 --set train.steps=6"
    " --set train.global_batch=24 --set train.eval_every=0 --set train.target_accuracy=0"
    " --set train.log_every=3 --set optimizer.name=adamw --set optimizer.lr=0.003 --set "
    "balance=off";
// 20 MiB does not hold the GPT's replicated state (16.5 MiB) and a sample with a tenth spare;
// 14 MiB holds ZeRO-2's unsharded part (weights, local gradients, a sample: 9.5 MiB) but not a
// third of the sharded state (AdamW's moments, the fp32 master and its gradient: 12.6 MiB).
const std::string kUnlike = " --set devices=cpu/20MiB,cpu/20MiB,cpu/14MiB";

// `settings` on top of the job is refused before any worker starts, with `message`.
void expectRefused(const std::string& settings, const std::string& message,
                   const std::string& name) {
  const auto run = chorusTrain(kJob + settings, name);
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find(message), std::string::npos) << run.output;
}

// `settings` trains the 6 steps, logging `plan`, with the losses of `roomy` (the same global
// batches on devices that hold it; shares and micro-batches differ, so up to the order of sums).
void expectTrainsAs(const std::string& settings, const std::string& plan, const std::string& roomy,
                    const std::string& name) {
  const auto tight = chorusTrain(kJob + settings, name);
  ASSERT_EQ(tight.exit_code, 0) << tight.output;
  EXPECT_NE(tight.output.find(plan), std::string::npos) << tight.output;
  ASSERT_EQ(tight.steps.size(), 6u) << tight.output;
  const auto reference = chorusTrain(kJob + roomy, name + "_roomy");
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  ASSERT_EQ(reference.steps.size(), 6u);
  for (size_t step = 0; step < 6; ++step) {
    const double expected = reference.steps[step]["loss"].get<double>();
    EXPECT_NEAR(tight.steps[step]["loss"].get<double>(), expected, 1e-5 * expected)
        << "step " << step + 1;
  }
}

const std::string kRoomy = " --set devices=cpu/64MiB,cpu/64MiB,cpu/64MiB";

TEST(ZeroMultiproc, OnlyShardsSizedByMemoryFitUnlikeDevices) {
  expectRefused(kUnlike, "ConfigError: device 'cpu/20M'", "zero_replicated");
  expectRefused(kUnlike + " --set zero.stage=2 --set zero.shards=even",
                "ConfigError: device 'cpu/14M'", "zero_even");
  expectTrainsAs(kUnlike + " --set zero.stage=2", "ZeRO-2 shards",
                 kRoomy + " --set zero.stage=2 --set zero.shards=even", "zero_memory");
}

// 10 MiB holds neither ZeRO-2's unsharded part (9.5 MiB, with a tenth spare) nor a third of
// ZeRO-3's state (9.6 MiB with a sample's 2.4): with parameters, gradients and optimizer state
// sharded by memory (57/37/6 %), the three devices train the GPT that 20 MiB cannot hold whole.
TEST(ZeroMultiproc, OnlyStageThreeWithShardsSizedByMemoryFitsDevicesTwiceApart) {
  const std::string unlike = " --set devices=cpu/20MiB,cpu/16MiB,cpu/10MiB";
  expectRefused(unlike, "ConfigError: device 'cpu/20M'", "zero3_replicated");
  expectRefused(unlike + " --set zero.stage=2",
                "device 'cpu/10M' (rank 2) cannot hold even its unsharded part", "zero3_stage2");
  expectRefused(unlike + " --set zero.stage=3 --set zero.shards=even",
                "ConfigError: device 'cpu/10M'", "zero3_even");
  const std::string dir = ::testing::TempDir() + "/chorus_zero3_checkpoints";
  std::filesystem::remove_all(dir);
  expectTrainsAs(unlike + " --set zero.stage=3 --set checkpoint.dir=" + dir, "ZeRO-3 shards",
                 kRoomy, "zero3_memory");
  // Its checkpoint resumes on two other budgets, resharded: each rank reads only the parts of
  // the saved slices that overlap its own (reading the whole state, as resumes did before, ran
  // out of 10 MiB on the same devices).
  const auto resumed =
      chorusTrain(kJob + " --set devices=cpu/24MiB,cpu/14MiB --set zero.stage=3" +
                      " --set checkpoint.dir=" + dir + " --set train.steps=8 --resume latest",
                  "zero3_resumed");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from"), std::string::npos) << resumed.output;
  EXPECT_EQ(resumed.steps.size(), 2u) << resumed.output;
}

}  // namespace
}  // namespace chorus::runtime
