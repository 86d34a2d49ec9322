// Restarting lost workers of an elastic job: the Supervisor starts a worker while run() is active
// (Supervisor::add), and `chorus run --elastic --max-restarts N` posts each loss and then starts a
// replacement under a new member id that names the rank it replaces. Real processes throughout:
// shell snippets under a Supervisor, then the `chorus` binary with the test worker.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "chorus/core/error.h"
#include "chorus/runtime/launch/agent.h"
#include "chorus/runtime/launch/supervisor.h"
#include "runtime/chorus_cli.h"
#include "runtime/supervisor_harness.h"

namespace chorus::runtime {
namespace {

using std::chrono::milliseconds;
using testing::exitOf;
using testing::Harness;
using testing::shell;
using testing::TempDir;
using testing::waitFor;

std::string readFile(const std::string& path) {
  std::ifstream file(path);
  return std::string(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
}

// Rank 0 fails alone; on_exit replaces it by rank 7, which fails too and is replaced by rank 8.
// Nothing else runs, so only the added workers keep run() going; the poll interval is far longer
// than the whole run, so only SIGCHLD can have woken run() to reap each of them.
TEST(SupervisorAdd, WorkerAddedFromOnExitIsSupervisedLikeTheOthers) {
  TempDir dir;
  Harness h;
  SupervisorOptions options = h.options();
  options.stop_on_failure = false;
  options.poll_interval = milliseconds(60000);
  options.log_dir = dir.path();
  Supervisor* supervisor = nullptr;
  std::vector<int> seen;
  std::vector<bool> added;
  options.on_exit = [&](const WorkerExit& exit) {
    seen.push_back(exit.rank);
    if (exit.rank == 0)
      added.push_back(
          supervisor->add(shell(7, "echo life 2 replaces $REPLACES; exit 5", {{"REPLACES", "0"}})));
    if (exit.rank == 7)
      added.push_back(supervisor->add(
          shell(8, "sleep 0.2; echo life 3 replaces $REPLACES", {{"REPLACES", "7"}})));
  };
  Supervisor owner(options);
  supervisor = &owner;
  owner.start({shell(0, "exit 3")});
  const SupervisorOutcome outcome = owner.run();
  EXPECT_EQ(seen, (std::vector<int>{0, 7, 8}));
  EXPECT_EQ(added, (std::vector<bool>{true, true}));
  ASSERT_EQ(outcome.exits.size(), 3u);
  EXPECT_EQ(exitOf(outcome, 0).code, 3);
  EXPECT_EQ(exitOf(outcome, 7).code, 5);
  EXPECT_TRUE(exitOf(outcome, 8).success());
  ASSERT_TRUE(outcome.first_failure);
  EXPECT_EQ(outcome.first_failure->rank, 0);
  EXPECT_EQ(owner.pids().size(), 3u);
  EXPECT_EQ(h.out.text(), "[rank 7] life 2 replaces 0\n[rank 8] life 3 replaces 7\n");
  EXPECT_EQ(readFile(dir.path() + "/rank-8.log"), "life 3 replaces 7\n");
}

// With stop_on_failure the first failure stops everyone: a replacement would only be stopped too.
TEST(SupervisorAdd, StartsNothingOnceTheWorkersAreBeingStopped) {
  TempDir dir;
  const std::string marker = dir.path() + "/started";
  Harness h;
  SupervisorOptions options = h.options();
  Supervisor* supervisor = nullptr;
  int refused = 0;
  options.on_exit = [&](const WorkerExit& exit) {
    if (exit.rank == 0 && !supervisor->add(shell(5, "touch " + marker + "; sleep 60"))) ++refused;
  };
  Supervisor owner(options);
  supervisor = &owner;
  owner.start({shell(0, "exit 3"), shell(1, "sleep 60")});
  const SupervisorOutcome outcome = owner.run();
  EXPECT_EQ(refused, 1);
  EXPECT_EQ(outcome.exits.size(), 2u);
  EXPECT_TRUE(exitOf(outcome, 1).stopped);
  EXPECT_EQ(owner.pids().size(), 2u);
  EXPECT_NE(::access(marker.c_str(), F_OK), 0);
}

// A bad launch throws out of add() but stops nobody: rank 1 still finishes on its own.
TEST(SupervisorAdd, RefusesRepeatedRanksAndBadLaunchesWithoutStoppingTheOthers) {
  TempDir dir;
  const std::string checked = dir.path() + "/checked";
  Harness h;
  SupervisorOptions options = h.options();
  options.stop_on_failure = false;
  Supervisor* supervisor = nullptr;
  int refusals = 0;
  options.on_exit = [&](const WorkerExit& exit) {
    if (exit.rank != 0) return;
    for (int rank : {0, 1}) {  // the one that ended, and one still running
      try {
        supervisor->add(shell(rank, "exit 0"));
      } catch (const ConfigError&) {
        ++refusals;
      }
    }
    try {
      supervisor->add(WorkerLaunch{2, {}, {}, {}});
    } catch (const ConfigError&) {
      ++refusals;
    }
    try {
      supervisor->add(WorkerLaunch{3, {"/nonexistent/chorus-worker"}, {}, {}});
    } catch (const LaunchError&) {
      ++refusals;
    }
    ::close(::creat(checked.c_str(), 0600));
  };
  Supervisor owner(options);
  supervisor = &owner;
  EXPECT_THROW(owner.add(shell(9, "exit 0")), LaunchError);  // before start()
  owner.start({shell(0, "exit 3"), shell(1, waitFor(checked) + "exit 0")});
  const SupervisorOutcome outcome = owner.run();
  EXPECT_EQ(refusals, 4);
  EXPECT_EQ(outcome.exits.size(), 2u);
  EXPECT_TRUE(exitOf(outcome, 1).success());
  EXPECT_FALSE(exitOf(outcome, 1).stopped);
  EXPECT_THROW(owner.add(shell(10, "exit 0")), LaunchError);  // after run() returned
}

TEST(ElasticRestart, MaxRestartsNeedsElasticAndMustNotBeNegative) {
  AgentOptions options;
  options.devices = {parseDeviceSpec("cpu")};
  options.command = {"true"};
  options.max_restarts = 1;
  EXPECT_THROW(runAgent(options), ConfigError);
  options.elastic = true;
  options.max_restarts = -1;
  EXPECT_THROW(runAgent(options), ConfigError);
  const auto run = chorus::testing::runCommand(std::string(CHORUS_BINARY) +
                                               " run --max-restarts 1 --devices cpu -- true");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  expectSays(run, "--max-restarts needs --elastic");
}

using RunResult = chorus::testing::CommandResult;
using chorus::testing::chorusRun;
using chorus::testing::expectSays;
using chorus::testing::killedPid;
using chorus::testing::testWorker;

std::size_t count(const std::string& text, const std::string& part) {
  std::size_t found = 0;
  for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++found;
  return found;
}

// Rank 1 is SIGKILLed once; its replacement, rank 3 (the job's first new member id), is told whom
// it replaces and finds the loss already posted: the agent posted it before starting it.
TEST(ElasticRestart, LostWorkerIsRestartedUnderANewRankAfterItsLossIsPosted) {
  TempDir logs;
  const RunResult run =
      chorusRun("--elastic --max-restarts 2 --devices cpu,cpu,cpu --log-dir " + logs.path(),
                testWorker("restart 1 1"));
  EXPECT_EQ(run.exit_code, 0) << run.output;
  const std::string pid = killedPid(run.output, "chorus run: lost ", 1);
  ASSERT_FALSE(pid.empty()) << run.output;
  const std::string restarting = "chorus run: restarting rank 1 as rank 3 (restart 1 of 2)";
  ASSERT_NE(run.output.find(restarting), std::string::npos) << run.output;
  EXPECT_LT(run.output.find("chorus run: lost rank 1 "), run.output.find(restarting));
  const std::string replaced =
      "rank 3 replaces 1: world 3 local 1 device cpu; elastic/exited/1 "
      "already set: rank 1 (pid " +
      pid + ") was killed by signal 9 (SIGKILL)";
  EXPECT_NE(run.output.find("[rank 3] " + replaced + "\n"), std::string::npos) << run.output;
  EXPECT_EQ(count(run.output, "chorus run: restarting"), 1u) << run.output;
  EXPECT_EQ(count(run.output, "chorus run: lost"), 1u) << run.output;
  EXPECT_EQ(run.output.find("were lost"), std::string::npos) << run.output;
  EXPECT_NE(readFile(logs.path() + "/rank-3.log").find(replaced), std::string::npos);
}

// Rank 0's line dies three times; with two restarts the third loss (rank 3) is not replaced. A
// replacement's own loss is posted under its new rank and it is replaced under a newer one.
TEST(ElasticRestart, RestartsStopAfterMaxRestarts) {
  const RunResult run =
      chorusRun("--elastic --max-restarts 2 --devices cpu,cpu", testWorker("restart 0 3"));
  EXPECT_EQ(run.exit_code, 0) << run.output;
  expectSays(run, "chorus run: restarting rank 0 as rank 2 (restart 1 of 2)");
  expectSays(run, "chorus run: restarting rank 2 as rank 3 (restart 2 of 2)");
  EXPECT_EQ(count(run.output, "chorus run: restarting"), 2u) << run.output;
  const std::string first = killedPid(run.output, "chorus run: lost ", 0);
  const std::string second = killedPid(run.output, "chorus run: lost ", 2);
  ASSERT_FALSE(first.empty()) << run.output;
  ASSERT_FALSE(second.empty()) << run.output;
  EXPECT_FALSE(killedPid(run.output, "chorus run: lost ", 3).empty()) << run.output;
  EXPECT_NE(run.output.find("[rank 2] rank 2 replaces 0: world 2 local 0 device cpu; "
                            "elastic/exited/0 already set: rank 0 (pid " +
                            first + ")"),
            std::string::npos)
      << run.output;
  // Rank 3 stands in for launch rank 0 too, whose loss was posted long before.
  EXPECT_NE(run.output.find("[rank 3] rank 3 replaces 0: world 2 local 0 device cpu; "
                            "elastic/exited/0 already set: rank 0 (pid " +
                            first + ")"),
            std::string::npos)
      << run.output;
  EXPECT_EQ(run.output.find("[rank 4]"), std::string::npos) << run.output;
  expectSays(run, "1 of 2 workers on this node were lost; the others finished");
}

// The node's result counts a replaced worker by its replacement: one worker that failed and was
// replaced by one that exits 0 is a success; when every life fails the node still exits 3.
TEST(ElasticRestart, NodeResultCountsAReplacedWorkerByItsReplacement) {
  const std::string says =
      "sh -c 'echo \"rank $CHORUS_RANK of $CHORUS_WORLD_SIZE replaces "
      "${CHORUS_ELASTIC_REPLACES:-none}\"; ";
  const RunResult recovered = chorusRun("--elastic --max-restarts 1 --devices cpu",
                                        says + "[ -n \"$CHORUS_ELASTIC_REPLACES\" ] || exit 4'");
  EXPECT_EQ(recovered.exit_code, 0) << recovered.output;
  EXPECT_NE(recovered.output.find("[rank 0] rank 0 of 1 replaces none\n"), std::string::npos)
      << recovered.output;
  EXPECT_NE(recovered.output.find("[rank 1] rank 1 of 1 replaces 0\n"), std::string::npos)
      << recovered.output;
  EXPECT_EQ(recovered.output.find("were lost"), std::string::npos) << recovered.output;
  EXPECT_EQ(recovered.output.find("every worker failed"), std::string::npos) << recovered.output;

  const RunResult failed = chorusRun("--elastic --max-restarts 1 --devices cpu", says + "exit 4'");
  EXPECT_EQ(failed.exit_code, 3) << failed.output;
  EXPECT_TRUE(std::regex_search(
      failed.output,
      std::regex("every worker failed; the last: rank 1 \\(pid [0-9]+\\) exited with code 4")))
      << failed.output;
}

// Two agents on this host play two nodes of 2 workers each, and each loses one worker: the two
// replacements draw distinct member ids (4 and 5, in either order) from the job's store.
TEST(ElasticRestart, ReplacementsOnDifferentNodesGetDistinctMemberIds) {
  const std::string secret = ::testing::TempDir() + "/restart_nodes.secret";
  ASSERT_EQ(
      system(("printf 'restart-node-test-secret-0123456' > " + secret + " && chmod 600 " + secret)
                 .c_str()),
      0);
  const std::string common = " --elastic --max-restarts 1 --nnodes 2 --rdzv-endpoint 127.0.0.1:" +
                             std::to_string(30900 + getpid() % 500) + " --secret-file " + secret +
                             " --devices cpu,cpu";
  RunResult node1;
  std::thread second(
      [&] { node1 = chorusRun("--node-rank 1" + common, testWorker("restart 0,2 1")); });
  const RunResult node0 = chorusRun("--node-rank 0" + common, testWorker("restart 0,2 1"));
  second.join();
  EXPECT_EQ(node0.exit_code, 0) << node0.output;
  EXPECT_EQ(node1.exit_code, 0) << node1.output;
  std::smatch on0, on1;
  const std::regex replaced0("\\[rank ([45])\\] rank \\1 replaces 0: world 4 local 0 ");
  const std::regex replaced2("\\[rank ([45])\\] rank \\1 replaces 2: world 4 local 0 ");
  ASSERT_TRUE(std::regex_search(node0.output, on0, replaced0)) << node0.output;
  ASSERT_TRUE(std::regex_search(node1.output, on1, replaced2)) << node1.output;
  EXPECT_NE(on0[1].str(), on1[1].str());
}

}  // namespace
}  // namespace chorus::runtime
