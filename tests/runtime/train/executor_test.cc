// The Trainer is one executor for every plan: the same loop (evaluations, checkpoints) runs a
// data-parallel and a pipeline plan, a checkpoint of one layout resumes on the other (a ZeRO one is
// refused by a pipeline with a CheckpointError naming both), the balancer hook works for both
// engines, and a hook an engine cannot honour is refused rather than ignored. Ranks run as threads
// over one in-memory store.
#include <gtest/gtest.h>

#include <filesystem>

#include "chorus/runtime/checkpoint/checkpoint.h"
#include "runtime/job_fixtures.h"
#include "runtime/trainer_threads.h"

namespace chorus::runtime {
namespace {

// A small GPT on synthetic tokens; two ranks run it data-parallel, or as a pipeline of two stages
// with parallel.pipeline_stages=2.
const std::string kJob =
    testing::jobStart({.seed = 3, .devices = "cpu,cpu", .balance = "off"},
                      {.steps = 6, .global_batch = 16, .eval_every = 2, .eval_samples = 32}) +
    testing::gptOnSynthetic({.width = 16, .context = 8, .size = 256}) +
    testing::optimizerTable({.name = "sgd", .lr = 0.05});

const std::vector<std::string> kPipeline = {"parallel.pipeline_stages=2",
                                            "parallel.micro_batches=2"};

std::string freshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/chorus_executor_" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

// The steps at which rank 0's records carried an evaluation, and the checkpoints written.
struct Loop {
  std::vector<std::int64_t> evaluated;
  std::vector<std::string> checkpoints;
  TrainResult result;
};

Loop runLoop(const std::vector<std::string>& plan, const std::string& dir) {
  std::vector<std::string> settings = plan;
  settings.insert(settings.end(),
                  {"checkpoint.dir=" + dir, "checkpoint.every=3", "checkpoint.keep=5"});
  Loop loop;
  const auto errors = testing::runTrainers(kJob, settings, 2, [&](Trainer& trainer, int rank) {
    TrainerHooks hooks;
    hooks.on_step = [&](const StepRecord& record) {
      if (rank == 0 && record.test_accuracy) loop.evaluated.push_back(record.step);
    };
    const TrainResult result = trainer.run(hooks);
    if (rank == 0) loop.result = result;
  });
  for (const auto& error : errors) EXPECT_EQ(error, "");
  loop.checkpoints = listCheckpoints(dir);
  return loop;
}

TEST(Executor, RunsTheSameLoopForADataParallelAndAPipelinePlan) {
  const Loop data_parallel = runLoop({}, freshDir("loop_dp"));
  const Loop pipeline = runLoop(kPipeline, freshDir("loop_pp"));
  // Steps 0..5: evaluations after steps 1, 3 and 5 (every 2 steps, and the last).
  const std::vector<std::int64_t> evaluated = {1, 3, 5};
  EXPECT_EQ(data_parallel.evaluated, evaluated);
  EXPECT_EQ(pipeline.evaluated, evaluated);
  // Checkpoints every 3 steps: at 3 and at the end (6), newest first.
  const std::vector<std::string> names = {checkpointName(6), checkpointName(3)};
  ASSERT_EQ(data_parallel.checkpoints.size(), 2u);
  ASSERT_EQ(pipeline.checkpoints.size(), 2u);
  for (std::size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(std::filesystem::path(data_parallel.checkpoints[i]).filename(), names[i]);
    EXPECT_EQ(std::filesystem::path(pipeline.checkpoints[i]).filename(), names[i]);
  }
  for (const Loop* loop : {&data_parallel, &pipeline}) {
    EXPECT_EQ(loop->result.steps, 6);
    EXPECT_TRUE(loop->result.test_accuracy.has_value());
    EXPECT_EQ(std::filesystem::path(loop->result.last_checkpoint).filename(), checkpointName(6));
  }
}

// Resumes the newest checkpoint in `dir` under `plan`; returns rank 0's error.
std::string resumeError(const std::vector<std::string>& plan, const std::string& dir) {
  std::vector<std::string> settings = plan;
  settings.push_back("checkpoint.dir=" + dir);
  const auto errors = testing::runTrainers(kJob, settings, 2, [&](Trainer& trainer, int) {
    trainer.resume(resolveCheckpoint("latest", dir));
  });
  return errors[0];
}

// A checkpoint of one layout resumes on the other, each rank reading its layers from the files
// that hold them (layer_state_restore.h); one that keeps no layer whole (ZeRO's slices) is
// refused by a pipeline, naming both.
TEST(Executor, ACheckpointOfOneLayoutResumesOnTheOther) {
  const std::string pipeline_dir = freshDir("layout_pp");
  runLoop(kPipeline, pipeline_dir);
  EXPECT_EQ(resumeError({}, pipeline_dir), "");
  const std::string data_parallel_dir = freshDir("layout_dp");
  runLoop({}, data_parallel_dir);
  EXPECT_EQ(resumeError(kPipeline, data_parallel_dir), "");

  const std::string zero_dir = freshDir("layout_zero");
  runLoop({"zero.stage=1"}, zero_dir);
  const std::string refused_by_pp = resumeError(kPipeline, zero_dir);
  EXPECT_NE(refused_by_pp.find("is of another job: the layout was ZeRO stage 1"), std::string::npos)
      << refused_by_pp;
}

// Rank 1 reports three times rank 0's seconds per sample to the balancer.
TrainerHooks skewedTimes(int rank) {
  TrainerHooks hooks;
  const double per_sample = rank == 0 ? 1e-3 : 3e-3;
  hooks.balancer_seconds = [per_sample](std::int64_t, std::int64_t samples) {
    return per_sample * static_cast<double>(samples);
  };
  return hooks;
}

TEST(Executor, TheDataParallelBalancerFollowsTheReportedSeconds) {
  std::vector<std::vector<std::int64_t>> last(2);
  const auto errors = testing::runTrainers(kJob, {"balance=adaptive", "train.global_batch=32"}, 2,
                                           [&](Trainer& trainer, int rank) {
                                             const TrainerHooks hooks = skewedTimes(rank);
                                             for (int step = 0; step < 12; ++step)
                                               trainer.step(hooks);
                                             last[rank] = trainer.shares();
                                           });
  for (const auto& error : errors) EXPECT_EQ(error, "");
  EXPECT_EQ(last[0], last[1]);
  ASSERT_EQ(last[0].size(), 2u);
  // 1 : 3 seconds per sample: ideally 24 : 8.
  EXPECT_EQ(last[0][0] + last[0][1], 32);
  EXPECT_GE(last[0][0], 2 * last[0][1]) << last[0][0] << "," << last[0][1];
}

}  // namespace
}  // namespace chorus::runtime
