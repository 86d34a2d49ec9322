// The plan an elastic pipeline job's survivors go on with (job_plan.h): every device keeps a stage,
// as near the launch depth as the device count allows, and the cut follows the devices left.
#include <gtest/gtest.h>

#include "chorus/core/error.h"
#include "chorus/runtime/job/job_config.h"
#include "chorus/runtime/job/job_plan.h"
#include "chorus/runtime/job/survivor_plan.h"
#include "runtime/job_fixtures.h"

namespace chorus::runtime {
namespace {

// A GPT of 4 layers (embedding, 2 blocks, head) in 3 stages over three CPUs, one slower.
const std::string kJob = testing::jobStart({.devices = "cpu,cpu@0.5,cpu"}, {.global_batch = 48}) +
                         testing::gptOnSynthetic({.size = std::nullopt}) + R"([parallel]
pipeline_stages = 3
micro_batches = 4
partition = [1, 2, 1]
)";

JobConfig job() { return readJobConfig(Config::parseString(kJob, "job.toml")); }

// The launch plan's ranks `kept`, in that order.
std::vector<plan::RankPlan> ranksOf(const plan::Plan& launch, const std::vector<int>& kept) {
  std::vector<plan::RankPlan> ranks;
  for (int rank : kept) ranks.push_back(launch.ranks.at(rank));
  return ranks;
}

TEST(SurvivorPlan, EveryDeviceKeepsAStageNearTheLaunchDepth) {
  EXPECT_EQ(survivorStages(2, 3, 4), 2);  // one of three stages lost
  EXPECT_EQ(survivorStages(3, 2, 4), 3);  // a rank of 2 x 2 lost: one deeper pipeline
  EXPECT_EQ(survivorStages(4, 2, 4), 2);  // replaced: 2 x 2 again
  EXPECT_EQ(survivorStages(6, 4, 8), 3);  // 2 x 3 is nearer 4 stages than 1 x 6
  EXPECT_EQ(survivorStages(8, 3, 8), 4);  // 2 and 4 are as near: more stages
  EXPECT_EQ(survivorStages(1, 2, 4), 1);  // a lone device trains the whole model
  EXPECT_EQ(survivorStages(5, 3, 4), 1);  // 5 stages for 4 layers: data parallelism
  EXPECT_THROW(survivorStages(0, 2, 4), ConfigError);
}

TEST(SurvivorPlan, TheSurvivorsAreCutOverTheirOwnDevices) {
  const JobConfig launch_job = job();
  const plan::Plan launch = planOfJob(launch_job, launch_job.devices);
  ASSERT_EQ(launch.stageCount(), 3);
  // Rank 0 lost: the slow CPU and the last one make two stages, the slow one taking fewer layers
  // (the listed partition was for three).
  const plan::Plan two = survivorPipelinePlan(launch_job, launch, ranksOf(launch, {1, 2}), 4);
  ASSERT_EQ(two.stageCount(), 2);
  ASSERT_EQ(two.replicas.size(), 1u);
  EXPECT_EQ(two.ranks.at(0).device_type, "cpu@0.5");
  EXPECT_EQ(two.ranks.at(1).device_type, "cpu");
  const auto& stages = two.replicas[0].stages;
  EXPECT_EQ(stages[0].first_layer, 0);
  EXPECT_EQ(stages[1].last_layer, 4);
  EXPECT_LE(stages[0].last_layer - stages[0].first_layer,
            stages[1].last_layer - stages[1].first_layer);
  EXPECT_EQ(two.replicas[0].share, 48);
  EXPECT_EQ(two.micro_batches, 4);
  // One left: one-stage data parallelism over the whole model.
  const plan::Plan one = survivorPipelinePlan(launch_job, launch, ranksOf(launch, {2}), 4);
  EXPECT_EQ(one.stageCount(), 1);
  EXPECT_EQ(one.replicas.at(0).stages.at(0).last_layer, 4);
  EXPECT_EQ(one.replicas[0].share, 48);
}

// A plan file's or the planner's pipeline, which the job's [parallel] does not repeat: the
// survivors go on with the launch plan's schedule and micro-batches, not the job's defaults.
TEST(SurvivorPlan, TheLaunchPlanNotTheJobSetsTheSurvivorsSchedule) {
  const JobConfig launch_job = job();
  plan::Plan launch = planOfJob(launch_job, launch_job.devices);
  launch.schedule = plan::Schedule::kGpipe;
  const JobConfig unpiped = readJobConfig(Config::parseString(
      "devices = \"cpu,cpu@0.5,cpu\"\n" + testing::trainTable({.global_batch = 48}) +
          testing::gptOnSynthetic({.size = std::nullopt}),
      "job.toml"));
  const plan::Plan two = survivorPipelinePlan(unpiped, launch, ranksOf(launch, {1, 2}), 4);
  EXPECT_EQ(two.stageCount(), 2);
  EXPECT_EQ(two.micro_batches, 4);  // the job's default is 8
  EXPECT_EQ(two.schedule, plan::Schedule::kGpipe);
}

}  // namespace
}  // namespace chorus::runtime
