// Elastic recovery of pipelines with real worker processes (docs/elastic.md): the survivors re-cut
// the model over themselves and take each layer from a member that holds it — a hybrid's other
// replica, a lone survivor's whole model for a replacement — or, where a lost stage has no copy,
// go back to the last checkpoint: a pipeline of fewer stages, one deeper pipeline out of a
// hybrid's ranks, a lone survivor that trains the whole model, a replacement that brings the
// launch layout back. Each run must finish with exit code 0, log every step once (or, going back,
// every step since the checkpoint once more), and end with the parameters of an uninterrupted run
// (fp32: where a layer runs and the order of the sums are the only differences).
#include <gtest/gtest.h>

#include <cstdio>

#include "runtime/elastic_run.h"

namespace chorus::testing {
namespace {

// Four layers (three hidden, one head), four micro-batches, a checkpoint every four steps.
std::string pipelineArgs(int stages, int replicas) {
  return "--set parallel.pipeline_stages=" + std::to_string(stages) +
         " --set parallel.replicas=" + std::to_string(replicas) +
         " --set parallel.micro_batches=4 --set checkpoint.every=4"
         " --set 'model.hidden=[64, 32, 32]'";
}

// Steps 1..`kill` logged, then `resumed`..kSteps again after going back to the checkpoint.
void expectStepsFromTheCheckpoint(const ElasticRun& run, int kill, int resumed) {
  std::vector<int> logged, expected;
  for (const auto& step : run.steps) logged.push_back(step.at("step").get<int>());
  for (int step = 1; step <= kill; ++step) expected.push_back(step);
  for (int step = resumed; step <= kSteps; ++step) expected.push_back(step);
  EXPECT_EQ(logged, expected) << run.run.output;
}

bool says(const ElasticRun& run, const std::string& text) {
  return run.run.output.find(text) != std::string::npos;
}

TEST(ElasticPipelineMultiproc, ALostStageIsRecutOverTheSurvivorsFromTheLastCheckpoint) {
  const std::string extra = pipelineArgs(3, 1);
  const ElasticRun run = runElastic("pipeline_stage", "cpu,cpu,cpu", "1:forward:9:KILL", extra);
  expectRecovered(run, {0, 2}, {1});
  EXPECT_EQ(run.recoveries.at(0).at("redo_step").get<int>(), 9);
  EXPECT_TRUE(says(run, "go on from step 8")) << run.run.output;
  EXPECT_TRUE(says(run, "pipeline: 2 stages x 1 replica(s)")) << run.run.output;
  expectStepsFromTheCheckpoint(run, 9, 9);
  expectSameModel(run, reference("cpu,cpu,cpu", extra));
}

// Two replicas of two stages lose a rank: the three left make one pipeline of three stages, and
// the lost stage's layers come from its copy in the other replica — no step is redone.
TEST(ElasticPipelineMultiproc, AHybridThatLosesARankGoesOnFromTheOtherReplica) {
  const std::string extra = pipelineArgs(2, 2);
  const ElasticRun run =
      runElastic("pipeline_hybrid", "cpu,cpu,cpu,cpu", "3:optimizer:6:KILL", extra);
  expectRecovered(run, {0, 1, 2}, {3});
  EXPECT_TRUE(says(run, "come from the members that hold them")) << run.run.output;
  EXPECT_TRUE(says(run, "pipeline: 3 stages x 1 replica(s)")) << run.run.output;
  expectEveryStepOnce(run);
  expectSameModel(run, reference("cpu,cpu,cpu,cpu", extra));
}

// A second loss while the members recover: rank 1, which held the lost stage's copy, dies too.
// The two left hold only the first stage, so they go back to the last checkpoint, as two stages.
TEST(ElasticPipelineMultiproc, ASecondLossDuringRecoveryTakesTheHybridBackToTheCheckpoint) {
  const std::string extra = pipelineArgs(2, 2);
  const ElasticRun run =
      runElastic("pipeline_second", "cpu,cpu,cpu,cpu", "3:forward:6:KILL,1:recovery:6:KILL", extra);
  expectRecovered(run, {0, 2}, {1, 3});
  EXPECT_TRUE(says(run, "go on from step 4")) << run.run.output;
  EXPECT_TRUE(says(run, "pipeline: 2 stages x 1 replica(s)")) << run.run.output;
  expectStepsFromTheCheckpoint(run, 6, 5);
  expectSameModel(run, reference("cpu,cpu,cpu,cpu", extra));
}

// A loss while the layers move: rank 1, the copy's holder, dies after every member said what it
// holds. The others may have taken values into their models already, so none offers its layers
// again: they go back to the last checkpoint.
TEST(ElasticPipelineMultiproc, ALossWhileTheLayersMoveTakesTheHybridBackToTheCheckpoint) {
  const std::string extra = pipelineArgs(2, 2);
  const ElasticRun run =
      runElastic("pipeline_moving", "cpu,cpu,cpu,cpu", "3:forward:6:KILL,1:regroup:6:KILL", extra);
  expectRecovered(run, {0, 2}, {1, 3});
  EXPECT_TRUE(says(run, "go on from step 4")) << run.run.output;
  expectStepsFromTheCheckpoint(run, 6, 5);
  expectSameModel(run, reference("cpu,cpu,cpu,cpu", extra));
}

// The first stage (rank 0, the log's writer) is lost from two: the other trains the whole model
// as one-stage data parallelism, from the stages' files of the checkpoint.
TEST(ElasticPipelineMultiproc, ALoneSurvivorOfTwoStagesTrainsTheWholeModel) {
  const std::string extra = pipelineArgs(2, 1);
  const ElasticRun run = runElastic("pipeline_lone", "cpu,cpu", "0:forward:11:KILL", extra);
  expectRecovered(run, {1}, {0});
  EXPECT_TRUE(says(run, "go on from step 8")) << run.run.output;
  EXPECT_TRUE(says(run, "on one stage per replica (1 ranks)")) << run.run.output;
  expectStepsFromTheCheckpoint(run, 11, 9);
  expectSameModel(run, reference("cpu,cpu", extra));
}

// The agent replaces the killed second stage (elastic.max_restarts = 1): rank 0 trains alone
// from the last checkpoint, and the replacement, held at its join (2:join:0:STOP) until rank 0
// has logged a step of its own (then continued by pid), takes the second stage's layers from
// rank 0: the two go on as two stages again without going back again. Rank 0 is slow (300 ms a
// step), so that the job outlasts the replacement's join.
TEST(ElasticPipelineMultiproc, AReplacementBringsTheLaunchLayoutBack) {
  const std::string extra = pipelineArgs(2, 1);
  const std::string log = ::testing::TempDir() + "/pipeline_restart.jsonl";
  std::remove(log.c_str());
  ElasticRun run;
  {
    // nlohmann writes keys in order: only a step line of generation 1 has this.
    const ContinueAfterRecovery resume(log, "\"generation\":1,\"loss\"");
    run = runElastic("pipeline_restart", "cpu,cpu",
                     "1:forward:5:KILL,0:forward:0:SLOW300,2:join:0:STOP",
                     extra + " --set elastic.max_restarts=1");
  }
  EXPECT_EQ(run.run.exit_code, 0) << run.run.output;
  ASSERT_EQ(run.recoveries.size(), 2u) << run.run.output;
  const nlohmann::json& loss = run.recoveries.front();
  EXPECT_EQ(loss.at("lost").get<std::vector<int>>(), (std::vector<int>{1})) << loss.dump();
  EXPECT_EQ(loss.at("members").get<std::vector<int>>(), (std::vector<int>{0})) << loss.dump();
  const nlohmann::json& join = run.recoveries.back();
  EXPECT_EQ(join.at("joined").get<std::vector<int>>(), (std::vector<int>{2})) << join.dump();
  EXPECT_EQ(join.at("members").get<std::vector<int>>(), (std::vector<int>{0, 2}));
  EXPECT_TRUE(says(run, "come from the members that hold them")) << run.run.output;
  // The join went back to no checkpoint: it goes on from the step rank 0 had reached alone.
  EXPECT_GT(join.at("redo_step").get<int>(), loss.at("redo_step").get<int>()) << join.dump();
  // The steps from the loss's checkpoint on run once each, in order, up to the end.
  const int from = loss.at("redo_step").get<int>();
  std::vector<int> tail, expected;
  for (const auto& step : run.steps)
    if (step.at("step").get<int>() >= from) tail.push_back(step.at("step").get<int>());
  for (int step = from; step <= kSteps; ++step) expected.push_back(step);
  ASSERT_GE(tail.size(), expected.size()) << run.run.output;
  EXPECT_EQ(std::vector<int>(tail.end() - expected.size(), tail.end()), expected) << run.run.output;
  expectSameModel(run, reference("cpu,cpu", extra));
}

}  // namespace
}  // namespace chorus::testing
