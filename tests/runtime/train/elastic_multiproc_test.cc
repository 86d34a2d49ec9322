// Elastic recovery of `chorus train` with real worker processes (docs/elastic.md): a worker
// killed during the forward pass, during the bucketed gradient all-reduce, just before the
// optimizer step (rank 0, the log's writer), during the recovery itself (a second failure), and
// a hung worker (SIGSTOP) that is left out and refused when it comes back, a killed worker
// that the agent replaces (elastic.max_restarts), whose replacement joins, and a worker killed
// while a background checkpoint is being written, and a ZeRO-2 rank whose slice comes back from
// the last checkpoint. Each run must finish
// with exit code 0, log every step exactly once, and end with the parameters of an uninterrupted
// run (fixed shares, fp32: the reduction order is the only difference).
#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "runtime/elastic_run.h"

namespace chorus::testing {
namespace {

TEST(ElasticMultiproc, KilledDuringForwardTheSurvivorsRedoTheStep) {
  const ElasticRun run = runElastic("forward", "cpu,cpu,cpu", "1:forward:5:KILL");
  expectRecovered(run, {0, 2}, {1});
  EXPECT_EQ(run.recoveries.at(0).at("redo_step").get<int>(), 6);
  EXPECT_EQ(run.recoveries.at(0).at("shares").get<std::vector<int>>(), (std::vector<int>{60, 60}));
  expectEveryStepOnce(run);
  expectSameModel(run, reference("cpu,cpu,cpu"));
}

TEST(ElasticMultiproc, KilledDuringTheBucketedAllReduce) {
  const ElasticRun run = runElastic("reduce", "cpu,cpu,cpu", "2:reduce:8:KILL");
  expectRecovered(run, {0, 1}, {2});
  expectEveryStepOnce(run);
  expectSameModel(run, reference("cpu,cpu,cpu"));
}

TEST(ElasticMultiproc, RankZeroKilledBeforeTheOptimizerStepAnotherTakesOverTheLog) {
  // Every rank's figures of step 7 had arrived: the survivors complete it; the new rank 0 logs
  // it, since the old one could not.
  const ElasticRun run = runElastic("optimizer", "cpu,cpu,cpu", "0:optimizer:6:KILL");
  expectRecovered(run, {1, 2}, {0});
  expectEveryStepOnce(run);
  expectSameModel(run, reference("cpu,cpu,cpu"));
}

TEST(ElasticMultiproc, ASecondFailureDuringRecovery) {
  // Rank 2 dies after the survivors agreed on {0, 2, 3}: they agree again on {0, 3}, whose
  // shares come from the world they trained in (uneven, so that a mix-up would show).
  const std::string shares = "--set balancer.shares=[10,20,40,50]";
  const ElasticRun run =
      runElastic("second", "cpu,cpu,cpu,cpu", "1:forward:4:KILL,2:recovery:4:KILL", shares);
  expectRecovered(run, {0, 3}, {1, 2});
  EXPECT_EQ(run.recoveries.back().at("shares").get<std::vector<int>>(),
            (std::vector<int>{20, 100}));
  expectEveryStepOnce(run);
  expectSameModel(run, reference("cpu,cpu,cpu,cpu", shares));
}

// A worker stopped by `fault` (SIGSTOP) is continued once the survivors have recovered (or
// after a minute, so that a failed recovery cannot hang the test): it is left out and stops,
// without writing to the log its successors write.
void expectHungWorkerLeftOut(const std::string& name, const std::string& fault,
                             const std::vector<int>& members, const std::vector<int>& lost) {
  const std::string log = ::testing::TempDir() + "/" + name + ".jsonl";
  std::remove(log.c_str());  // an earlier run's recovery must not count
  ElasticRun run;
  {
    const ContinueAfterRecovery resume(log);
    run = runElastic(name, "cpu,cpu,cpu", fault);
  }
  expectRecovered(run, members, lost);
  EXPECT_NE(run.recoveries.at(0).at("reason").get<std::string>().find("missed 3 heartbeats"),
            std::string::npos)
      << run.recoveries.at(0).dump();
  EXPECT_NE(run.run.output.find("was left out of the job"), std::string::npos) << run.run.output;
  expectEveryStepOnce(run);
  for (const nlohmann::json& step : run.steps) {
    if (step.at("step").get<int>() >= run.recoveries.at(0).at("redo_step").get<int>()) {
      EXPECT_EQ(step.value("generation", 0), 1) << step.dump();
    }
  }
  expectSameModel(run, reference("cpu,cpu,cpu"));
}

TEST(ElasticMultiproc, AHungWorkerIsLeftOutByTheHeartbeatAndRefusedWhenItComesBack) {
  expectHungWorkerLeftOut("hung", "1:forward:5:STOP", {0, 2}, {1});
}

TEST(ElasticMultiproc, AHungRankZeroComesBackWithoutTouchingTheLog) {
  // Stopped after every rank's figures of step 6 arrived: when continued it could finish that
  // step of its old generation, and must not log it.
  expectHungWorkerLeftOut("hung_rank0", "0:optimizer:5:STOP", {1, 2}, {0});
}

TEST(ElasticMultiproc, BelowMinDevicesTheSurvivorsCheckpointAndStop) {
  const ElasticRun run =
      runElastic("min_devices", "cpu,cpu", "1:forward:3:KILL", "--set elastic.min_devices=2");
  EXPECT_NE(run.run.exit_code, 0) << run.run.output;
  EXPECT_NE(run.run.output.find("fewer than elastic.min_devices = 2"), std::string::npos)
      << run.run.output;
  EXPECT_NE(run.run.output.find("checkpoint written"), std::string::npos) << run.run.output;
}

TEST(ElasticMultiproc, AKilledWorkerIsReplacedAndItsReplacementTakesItsShare) {
  // Uneven fixed shares, so that the replacement's share shows it took rank 1's place; rank 0 is
  // slow (400 ms a step), so that the job outlasts the replacement's start.
  const std::string extra = "--set balancer.shares=[20,40,60] --set elastic.max_restarts=1";
  const ElasticRun run =
      runElastic("restart", "cpu,cpu,cpu", "1:forward:2:KILL,0:forward:0:SLOW400", extra);
  EXPECT_EQ(run.run.exit_code, 0) << run.run.output;
  // The loss and the join take one generation each, or one together when the replacement is
  // ready before the survivors agreed on the loss (rank 0 may still be in its slow step).
  ASSERT_GE(run.recoveries.size(), 1u) << run.run.output;
  ASSERT_LE(run.recoveries.size(), 2u) << run.run.output;
  const nlohmann::json& loss = run.recoveries.front();
  EXPECT_EQ(loss.at("lost").get<std::vector<int>>(), (std::vector<int>{1})) << loss.dump();
  if (run.recoveries.size() == 2) {
    EXPECT_EQ(loss.at("shares").get<std::vector<int>>(), (std::vector<int>{30, 90}));
    EXPECT_TRUE(loss.at("joined").empty()) << loss.dump();
  }
  // The agent started rank 3 in place of rank 1: it joined at a step boundary with the share
  // rank 1 had, and every step from there on ran on three ranks.
  const nlohmann::json& join = run.recoveries.back();
  EXPECT_EQ(join.at("joined").get<std::vector<int>>(), (std::vector<int>{3})) << join.dump();
  EXPECT_EQ(join.at("members").get<std::vector<int>>(), (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(join.at("shares").get<std::vector<int>>(), (std::vector<int>{20, 60, 40}));
  EXPECT_NE(run.run.output.find("rank 3 asks to join the job in place of rank 1"),
            std::string::npos)
      << run.run.output;
  const int joined_at = join.at("redo_step").get<int>();
  EXPECT_LE(joined_at, kSteps) << run.run.output;
  expectEveryStepOnce(run);
  for (const nlohmann::json& step : run.steps) {
    if (step.at("step").get<int>() >= joined_at) {
      EXPECT_EQ(step.at("shares").get<std::vector<int>>(), (std::vector<int>{20, 60, 40}))
          << step.dump();
    }
  }
  EXPECT_NE(run.run.output.find("restarting rank 1 as rank 3"), std::string::npos)
      << run.run.output;
  expectSameModel(run, reference("cpu,cpu,cpu", extra));
}

TEST(ElasticMultiproc, KilledWhileAnAsyncCheckpointIsBeingWritten) {
  // Checkpoints every 4 steps in the background; rank 1 dies while the one after step 8 is being
  // written. The survivors give that write up with its generation (not at the checkpoint
  // deadline of 10 minutes) and write the later ones; what is published is complete.
  const std::string extra = "--set checkpoint.every=4 --set checkpoint.async=true";
  const auto start = std::chrono::steady_clock::now();
  const ElasticRun run =
      runElastic("async_checkpoint", "cpu,cpu,cpu", "1:checkpoint:7:KILL", extra);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(120));
  expectRecovered(run, {0, 2}, {1});
  EXPECT_EQ(run.recoveries.at(0).at("redo_step").get<int>(), 9);
  expectEveryStepOnce(run);
  const std::string dir = ::testing::TempDir() + "/chorus_elastic_async_checkpoint";
  const auto checkpoints = runtime::listCheckpoints(dir);
  ASSERT_FALSE(checkpoints.empty());
  EXPECT_EQ(checkpoints.front(), runtime::checkpointName(kSteps));
  for (const std::string& name : checkpoints)
    EXPECT_NO_THROW(runtime::verifyCheckpoint(dir + "/" + name)) << name;
  expectSameModel(run, reference("cpu,cpu,cpu", extra));
}

// ZeRO-2: a lost rank's slice of the optimizer state is held nowhere else. The survivors restore
// the last complete checkpoint (after step 8; rank 1 dies in step 10's forward), resharded over
// the two of them, and redo steps 9 and 10: step 9 is logged twice, and the run ends where an
// uninterrupted one does.
TEST(ElasticMultiproc, AZeroSliceOfALostRankComesBackFromTheLastCheckpoint) {
  const std::string extra = "--set zero.stage=2 --set checkpoint.every=4";
  const ElasticRun run = runElastic("zero", "cpu,cpu,cpu", "1:forward:9:KILL", extra);
  expectRecovered(run, {0, 2}, {1});
  EXPECT_EQ(run.recoveries.at(0).at("redo_step").get<int>(), 9);
  EXPECT_NE(run.run.output.find("go on from step 8"), std::string::npos) << run.run.output;
  std::vector<int> logged;
  for (const auto& step : run.steps) logged.push_back(step.at("step").get<int>());
  std::vector<int> expected;
  for (int step = 1; step <= 9; ++step) expected.push_back(step);
  for (int step = 9; step <= kSteps; ++step) expected.push_back(step);
  EXPECT_EQ(logged, expected) << run.run.output;
  expectSameModel(run, reference("cpu,cpu,cpu", extra));
}

// ZeRO-3: the parameters too are sliced; the survivors take the lost rank's slice of them from the
// checkpoint as well (its rank file; a ZeRO-3 checkpoint has no model file).
TEST(ElasticMultiproc, AZeroThreeRanksParametersComeBackFromTheLastCheckpoint) {
  const std::string extra = "--set zero.stage=3 --set checkpoint.every=4";
  const ElasticRun run = runElastic("zero3", "cpu,cpu,cpu", "2:forward:9:KILL", extra);
  expectRecovered(run, {0, 1}, {2});
  EXPECT_EQ(run.recoveries.at(0).at("redo_step").get<int>(), 9);
  EXPECT_EQ(run.steps.back().at("step").get<int>(), kSteps);
  expectSameModel(run, reference("cpu,cpu,cpu", extra));
}

// A second loss while the survivors build their next engine: rank 2 dies just before its ZeRO-3
// engine is built, so ranks 0 and 3 fail inside their builds (every rank's micro-batch limit is
// agreed there) and are left without an engine, their training state gone. Rank 0, the next
// source, says so and takes the members back to the last checkpoint (after step 8), from which
// the run ends where an uninterrupted one does.
TEST(ElasticMultiproc, ALossDuringTheEnginesRebuildTakesTheJobBackToTheLastCheckpoint) {
  const std::string extra = "--set zero.stage=3 --set checkpoint.every=4";
  const ElasticRun run =
      runElastic("zero3_rebuild", "cpu,cpu,cpu,cpu", "1:forward:9:KILL,2:rebuild:9:KILL", extra);
  expectRecovered(run, {0, 3}, {1, 2});
  EXPECT_NE(run.run.output.find("lost its training state when a loss interrupted its engine's "
                                "rebuild"),
            std::string::npos)
      << run.run.output;
  EXPECT_EQ(run.recoveries.back().at("redo_step").get<int>(), 9);
  EXPECT_EQ(run.steps.back().at("step").get<int>(), kSteps);
  expectSameModel(run, reference("cpu,cpu,cpu,cpu", extra));
}

// zero.redundancy = 1: rank 0 keeps a replica of rank 1's slice, so rank 1's loss in step 10's
// forward costs no going back: the survivors cut the slices anew from what they hold and redo
// step 10 alone. Every step is logged once and the run ends where an uninterrupted run without
// replicas does.
TEST(ElasticMultiproc, AZeroSliceOfALostRankComesBackFromItsReplica) {
  const std::string zero = "--set zero.stage=2 --set checkpoint.every=4";
  const ElasticRun run = runElastic("zero_replica", "cpu,cpu,cpu", "1:forward:9:KILL",
                                    zero + " --set zero.redundancy=1");
  expectRecovered(run, {0, 2}, {1});
  EXPECT_EQ(run.recoveries.at(0).at("redo_step").get<int>(), 10);
  EXPECT_NE(run.run.output.find("rebuilt from the members' replicas at step 9"), std::string::npos)
      << run.run.output;
  expectEveryStepOnce(run);
  expectSameModel(run, reference("cpu,cpu,cpu", zero));
}

// Rank 0 dies after every rank's figures of step 7 arrived: the others step their slices (rank
// 2 its replica of rank 0's too) and then fail the parameters' all-gather. The step is theirs:
// they log it, and the next generation goes on from step 8 with the parameters put together from
// the slices.
TEST(ElasticMultiproc, AZeroRankLostBeforeTheOptimizerStepLeavesTheStepDone) {
  const std::string zero = "--set zero.stage=1 --set checkpoint.every=4";
  const ElasticRun run = runElastic("zero_replica_optimizer", "cpu,cpu,cpu", "0:optimizer:6:KILL",
                                    zero + " --set zero.redundancy=1");
  expectRecovered(run, {1, 2}, {0});
  EXPECT_EQ(run.recoveries.at(0).at("redo_step").get<int>(), 8);
  EXPECT_NE(run.run.output.find("rebuilt from the members' replicas"), std::string::npos)
      << run.run.output;
  expectEveryStepOnce(run);
  expectSameModel(run, reference("cpu,cpu,cpu", zero));
}

// ZeRO-3: the lost rank's slice of the parameters comes back from its replica too.
TEST(ElasticMultiproc, AZeroThreeRanksParametersComeBackFromTheirReplica) {
  const std::string zero = "--set zero.stage=3 --set checkpoint.every=4";
  const ElasticRun run = runElastic("zero3_replica", "cpu,cpu,cpu", "2:reduce:8:KILL",
                                    zero + " --set zero.redundancy=1");
  expectRecovered(run, {0, 1}, {2});
  EXPECT_NE(run.run.output.find("rebuilt from the members' replicas"), std::string::npos)
      << run.run.output;
  expectEveryStepOnce(run);
  expectSameModel(run, reference("cpu,cpu,cpu", zero));
}

// ZeRO-1 with replicas and a replacement: neither the loss nor the join goes back to a
// checkpoint; the replacement's slice (and its replica of its successor's) is cut for it from
// the members'. Every step is logged once.
TEST(ElasticMultiproc, AReplacementOfAZeroRankTakesItsSliceFromTheMembersReplicas) {
  const std::string zero = "--set zero.stage=1 --set checkpoint.every=2";
  const ElasticRun run =
      runElastic("zero_replica_restart", "cpu,cpu,cpu", "1:forward:2:KILL,0:forward:0:SLOW400",
                 zero + " --set zero.redundancy=1 --set elastic.max_restarts=1");
  EXPECT_EQ(run.run.exit_code, 0) << run.run.output;
  // The replacement may join in the generation that lost rank 1, or in the next.
  ASSERT_GE(run.recoveries.size(), 1u) << run.run.output;
  EXPECT_EQ(run.recoveries.back().at("joined").get<std::vector<int>>(), (std::vector<int>{3}));
  EXPECT_EQ(run.recoveries.back().at("members").get<std::vector<int>>(),
            (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(run.run.output.find("cannot come back from replicas"), std::string::npos)
      << run.run.output;
  expectEveryStepOnce(run);
  expectSameModel(run, reference("cpu,cpu,cpu", zero));
}

// Two ranks: the survivor of rank 1's loss is a world of one, which keeps no replica, yet it
// holds every slice; the replacement takes its slice from it, and nothing goes back to a
// checkpoint.
TEST(ElasticMultiproc, AReplacementJoinsALoneZeroSurvivorWithoutGoingBack) {
  const std::string zero = "--set zero.stage=2 --set checkpoint.every=2";
  const ElasticRun run =
      runElastic("zero_replica_lone", "cpu,cpu", "1:forward:2:KILL,0:forward:0:SLOW400",
                 zero + " --set zero.redundancy=1 --set elastic.max_restarts=1");
  EXPECT_EQ(run.run.exit_code, 0) << run.run.output;
  ASSERT_GE(run.recoveries.size(), 1u) << run.run.output;
  EXPECT_EQ(run.recoveries.back().at("members").get<std::vector<int>>(), (std::vector<int>{0, 2}));
  EXPECT_EQ(run.run.output.find("cannot come back from replicas"), std::string::npos)
      << run.run.output;
  expectEveryStepOnce(run);
  expectSameModel(run, reference("cpu,cpu", zero));
}

// Ranks 1 and 2 die together: rank 2's replica was on rank 1, so its slice is nowhere; the
// survivors go back to the last checkpoint as without replicas (steps 9 and 10 logged twice).
TEST(ElasticMultiproc, TwoNeighboursLostTakeTheZeroJobBackToTheLastCheckpoint) {
  const std::string zero = "--set zero.stage=2 --set checkpoint.every=4";
  const ElasticRun run =
      runElastic("zero_replica_neighbours", "cpu,cpu,cpu,cpu", "1:forward:9:KILL,2:forward:9:KILL",
                 zero + " --set zero.redundancy=1");
  expectRecovered(run, {0, 3}, {1, 2});
  EXPECT_NE(run.run.output.find("cannot come back from replicas"), std::string::npos)
      << run.run.output;
  EXPECT_EQ(run.recoveries.back().at("redo_step").get<int>(), 9);
  EXPECT_EQ(run.steps.back().at("step").get<int>(), kSteps);
  expectSameModel(run, reference("cpu,cpu,cpu,cpu", zero));
}

// ZeRO-1 with a replacement: the loss and the join each take the members back to the last
// checkpoint (a join reshards the slices too, and the old world is gone), the joiner included,
// which restores its new slice from there. Every step is logged, the steps since a checkpoint
// again after each restore, and the run ends where an uninterrupted one does.
TEST(ElasticMultiproc, AReplacementOfAZeroRankRestoresItsSliceFromTheLastCheckpoint) {
  const std::string extra =
      "--set zero.stage=1 --set checkpoint.every=2 --set elastic.max_restarts=1";
  const ElasticRun run =
      runElastic("zero_restart", "cpu,cpu,cpu", "1:forward:2:KILL,0:forward:0:SLOW400", extra);
  EXPECT_EQ(run.run.exit_code, 0) << run.run.output;
  ASSERT_GE(run.recoveries.size(), 1u) << run.run.output;
  const nlohmann::json& join = run.recoveries.back();
  EXPECT_EQ(join.at("joined").get<std::vector<int>>(), (std::vector<int>{3})) << join.dump();
  EXPECT_EQ(join.at("members").get<std::vector<int>>(), (std::vector<int>{0, 2, 3}));
  // Each recovery went back to a checkpoint: an even step.
  for (const auto& recovery : run.recoveries)
    EXPECT_EQ(recovery.at("redo_step").get<int>() % 2, 1) << recovery.dump();
  std::set<int> logged;
  for (const auto& step : run.steps) logged.insert(step.at("step").get<int>());
  EXPECT_EQ(static_cast<int>(logged.size()), kSteps) << run.run.output;
  EXPECT_EQ(run.steps.back().at("step").get<int>(), kSteps);
  expectSameModel(run, reference("cpu,cpu,cpu", extra));
}

}  // namespace
}  // namespace chorus::testing
