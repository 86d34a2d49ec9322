// The heterogeneous point of ZeRO, with real worker processes and enforced memory budgets: three
// devices of unlike memory on which the GPT with AdamW fits neither replicated (stage 0) nor with
// even ZeRO-2 shards (the smallest device cannot hold a third of the state), each refused before
// any worker starts with a ConfigError naming the device; with shards sized by memory it trains,
// every worker inside its budget (the counting allocator raises OutOfMemoryError past it), and
// its losses are those of the same job with even shards on devices that fit it. Then the same for
// ZeRO-3 on devices three times apart, where only parameters sharded by memory fit.
#include <gtest/gtest.h>

#include "chorus_cli.h"

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

TEST(ZeroMultiproc, OnlyShardsSizedByMemoryFitUnlikeDevices) {
  const auto replicated = chorusTrain(kJob + kUnlike, "zero_replicated");
  EXPECT_EQ(replicated.exit_code, 2) << replicated.output;
  EXPECT_NE(replicated.output.find("ConfigError: device 'cpu/20M'"), std::string::npos)
      << replicated.output;

  const auto even =
      chorusTrain(kJob + kUnlike + " --set zero.stage=2 --set zero.shards=even", "zero_even");
  EXPECT_EQ(even.exit_code, 2) << even.output;
  EXPECT_NE(even.output.find("ConfigError: device 'cpu/14M'"), std::string::npos) << even.output;

  const auto by_memory = chorusTrain(kJob + kUnlike + " --set zero.stage=2", "zero_memory");
  ASSERT_EQ(by_memory.exit_code, 0) << by_memory.output;
  EXPECT_NE(by_memory.output.find("ZeRO-2 shards"), std::string::npos) << by_memory.output;
  ASSERT_EQ(by_memory.steps.size(), 6u) << by_memory.output;

  // The same global batches on devices that hold even shards: the same losses (shares and
  // micro-batches differ, so up to the order of sums).
  const auto roomy =
      chorusTrain(kJob +
                      " --set devices=cpu/64MiB,cpu/64MiB,cpu/64MiB --set zero.stage=2 --set "
                      "zero.shards=even",
                  "zero_roomy");
  ASSERT_EQ(roomy.exit_code, 0) << roomy.output;
  ASSERT_EQ(roomy.steps.size(), 6u);
  for (size_t step = 0; step < 6; ++step) {
    const double expected = roomy.steps[step]["loss"].get<double>();
    EXPECT_NEAR(by_memory.steps[step]["loss"].get<double>(), expected, 1e-5 * expected)
        << "step " << step + 1;
  }
}

// 10 MiB holds neither ZeRO-2's unsharded part (9.5 MiB, with a tenth spare) nor a third of
// ZeRO-3's state (9.6 MiB with a sample's 2.4): with parameters, gradients and optimizer state
// sharded by memory (57/37/6 %), the three devices train the GPT that 20 MiB cannot hold whole.
TEST(ZeroMultiproc, OnlyStageThreeWithShardsSizedByMemoryFitsDevicesTwiceApart) {
  const std::string unlike = " --set devices=cpu/20MiB,cpu/16MiB,cpu/10MiB";
  const auto replicated = chorusTrain(kJob + unlike, "zero3_replicated");
  EXPECT_EQ(replicated.exit_code, 2) << replicated.output;
  EXPECT_NE(replicated.output.find("ConfigError: device 'cpu/20M'"), std::string::npos)
      << replicated.output;

  const auto stage_two = chorusTrain(kJob + unlike + " --set zero.stage=2", "zero3_stage_two");
  EXPECT_EQ(stage_two.exit_code, 2) << stage_two.output;
  EXPECT_NE(stage_two.output.find("device 'cpu/10M' (rank 2) cannot hold even its unsharded part"),
            std::string::npos)
      << stage_two.output;

  const auto even =
      chorusTrain(kJob + unlike + " --set zero.stage=3 --set zero.shards=even", "zero3_even");
  EXPECT_EQ(even.exit_code, 2) << even.output;
  EXPECT_NE(even.output.find("ConfigError: device 'cpu/10M'"), std::string::npos) << even.output;

  const auto by_memory = chorusTrain(kJob + unlike + " --set zero.stage=3", "zero3_memory");
  ASSERT_EQ(by_memory.exit_code, 0) << by_memory.output;
  EXPECT_NE(by_memory.output.find("ZeRO-3 shards"), std::string::npos) << by_memory.output;
  ASSERT_EQ(by_memory.steps.size(), 6u) << by_memory.output;

  // Replicated on devices that hold it: the same losses, up to the order of sums (the budgets
  // cut the shares into other micro-batches).
  const auto roomy =
      chorusTrain(kJob + " --set devices=cpu/64MiB,cpu/64MiB,cpu/64MiB", "zero3_roomy");
  ASSERT_EQ(roomy.exit_code, 0) << roomy.output;
  ASSERT_EQ(roomy.steps.size(), 6u);
  for (size_t step = 0; step < 6; ++step) {
    const double expected = roomy.steps[step]["loss"].get<double>();
    EXPECT_NEAR(by_memory.steps[step]["loss"].get<double>(), expected, 1e-5 * expected)
        << "step " << step + 1;
  }
}

}  // namespace
}  // namespace chorus::runtime
