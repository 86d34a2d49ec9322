// Per-stage peak memory, measured by charging each rank's allocations to its own MemoryAccount
// (MemoryMeter), and what activation checkpointing saves.
#include <gtest/gtest.h>

#include "chorus/device/memory_meter.h"
#include "pipeline_test_util.h"

namespace chorus::parallel {
namespace {

testing::Job memoryJob() {
  testing::Job job = testing::gptJob();
  job.model.width = 64;
  job.model.context = 32;
  job.model.vocab = 32;
  job.global_batch = 32;
  job.steps = 2;
  return job;
}

// Peak bytes of each stage in the last step.
std::vector<std::uint64_t> stagePeaks(Schedule schedule, Checkpointing checkpointing) {
  PipelineOptions options;
  options.pipeline_stages = 2;
  options.schedule = schedule;
  options.micro_batches = 8;
  options.partition = "even";
  options.activation_checkpointing = checkpointing;
  std::vector<std::shared_ptr<device::MemoryAccount>> accounts(2);
  for (auto& account : accounts) account = std::make_shared<device::MemoryAccount>();
  const auto results = testing::trainPipeline(
      memoryJob(), options,
      [&](int rank, PipelineResources& resources) { resources.memory = accounts[rank]; });
  std::vector<std::uint64_t> peaks;
  for (const auto& rank : results) {
    const PipelineStepStats& last = rank.steps.back();
    std::printf(
        "%-5s checkpointing=%-5s stage %d: peak %8.2f MiB (held between passes %6.2f MiB, "
        "in flight %d)\n",
        toString(schedule), toString(checkpointing), rank.position.stage,
        static_cast<double>(last.peak_bytes) / (1 << 20),
        static_cast<double>(last.peak_held_bytes) / (1 << 20), last.max_in_flight);
    peaks.push_back(last.peak_bytes);
  }
  return peaks;
}

class PipelineMemory : public ::testing::Test {
 protected:
  void SetUp() override { meter_ = device::MemoryMeter::install(); }
  void TearDown() override { meter_->uninstall(); }
  std::shared_ptr<device::MemoryMeter> meter_;
};

TEST_F(PipelineMemory, CheckpointingLowersEachStagesPeak) {
  for (Schedule schedule : {Schedule::kGpipe, Schedule::kOneFOneB}) {
    const auto none = stagePeaks(schedule, Checkpointing::kNone);
    const auto stage = stagePeaks(schedule, Checkpointing::kStage);
    const auto layer = stagePeaks(schedule, Checkpointing::kLayer);
    ASSERT_EQ(none.size(), 2u);
    // Stage 0 holds several micro-batches under both schedules: checkpointing must pay off there.
    EXPECT_LT(stage[0], none[0] * 0.7) << toString(schedule);
    EXPECT_LT(layer[0], none[0] * 0.7) << toString(schedule);
    if (schedule == Schedule::kGpipe) {
      // GPipe's last stage also holds all 8 micro-batches.
      EXPECT_LT(stage[1], none[1]);
    } else {
      // 1F1B's last stage holds one micro-batch at a time and does not checkpoint: no change.
      EXPECT_NEAR(static_cast<double>(stage[1]), static_cast<double>(none[1]), 0.1 * none[1]);
    }
  }
}

TEST_F(PipelineMemory, OneFOneBHoldsLessThanGPipe) {
  const auto gpipe = stagePeaks(Schedule::kGpipe, Checkpointing::kNone);
  const auto one_f_one_b = stagePeaks(Schedule::kOneFOneB, Checkpointing::kNone);
  // 8 micro-batches in flight against 2 on stage 0, and 8 against 1 on stage 1.
  EXPECT_LT(one_f_one_b[0], gpipe[0] * 0.6);
  EXPECT_LT(one_f_one_b[1], gpipe[1] * 0.6);
}

}  // namespace
}  // namespace chorus::parallel
