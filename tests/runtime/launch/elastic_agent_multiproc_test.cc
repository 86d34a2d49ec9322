// The elastic mode of the launch layer: a lost worker stops no other, the supervisor reports each
// exit as it is reaped, and `chorus run --elastic` posts each loss in the job's store, where the
// survivors read it. Real processes throughout: shell snippets under a Supervisor, then the
// `chorus` binary with the test worker. (Without --elastic a crash stops the job:
// LauncherMultiproc.CrashingWorkerStopsTheJobAndIsNamed.)
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "chorus/core/clock.h"
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

// Rank 1 goes on only once on_exit reported rank 0's failure: proof that the failure stopped
// nobody and was reported while the others still ran. The poll interval is far longer than the
// whole run, so only SIGCHLD can have woken run() to reap rank 0 that soon.
TEST(SupervisorElastic, FailureStopsNobodyAndEachExitIsReportedAsReaped) {
  TempDir dir;
  const std::string reported = dir.path() + "/reported";
  Harness h;
  SupervisorOptions options = h.options();
  options.stop_on_failure = false;
  options.poll_interval = milliseconds(60000);
  std::vector<WorkerExit> seen;
  options.on_exit = [&](const WorkerExit& exit) {
    seen.push_back(exit);
    if (exit.rank == 0) ::close(::creat(reported.c_str(), 0600));
  };
  Supervisor supervisor(options);
  supervisor.start({shell(0, "exit 3"), shell(1, waitFor(reported) + "exit 0")});
  Stopwatch watch;
  const SupervisorOutcome outcome = supervisor.run();
  EXPECT_LT(watch.seconds(), 5.0);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].rank, 0);
  EXPECT_EQ(seen[0].code, 3);
  EXPECT_FALSE(seen[0].stopped);
  EXPECT_EQ(seen[1].rank, 1);
  EXPECT_TRUE(seen[1].success());
  EXPECT_FALSE(seen[1].stopped);
  EXPECT_TRUE(exitOf(outcome, 1).success());
  EXPECT_FALSE(exitOf(outcome, 1).stopped);
  ASSERT_TRUE(outcome.first_failure);
  EXPECT_EQ(outcome.first_failure->rank, 0);
  EXPECT_EQ(outcome.first_failure->code, 3);
  EXPECT_FALSE(outcome.ok());
  EXPECT_EQ(outcome.interrupt_signal, 0);
}

TEST(SupervisorElastic, InterruptStillStopsEveryWorker) {
  Harness h;
  SupervisorOptions options = h.options();
  options.stop_on_failure = false;
  // Ctrl-C at the agent once rank 0 was lost: rank 1, which would sleep a minute, is stopped.
  options.on_exit = [](const WorkerExit& exit) {
    if (exit.rank == 0) ::kill(::getpid(), SIGINT);
  };
  Supervisor supervisor(options);
  supervisor.start({shell(0, "exit 3"), shell(1, "sleep 60")});
  Stopwatch watch;
  const SupervisorOutcome outcome = supervisor.run();
  EXPECT_LT(watch.seconds(), 5.0);
  EXPECT_EQ(outcome.interrupt_signal, SIGINT);
  ASSERT_TRUE(outcome.first_failure);
  EXPECT_EQ(outcome.first_failure->rank, 0);
  const WorkerExit& stopped = exitOf(outcome, 1);
  EXPECT_TRUE(stopped.stopped);
  EXPECT_TRUE(stopped.signaled);
  EXPECT_EQ(stopped.code, SIGTERM);
}

using RunResult = chorus::testing::CommandResult;
using chorus::testing::chorusRun;
using chorus::testing::killedPid;
using chorus::testing::testWorker;

// The survivors wait for the store key and print it: they finish only if the agent posted it.
TEST(ElasticAgentMultiproc, LostRankIsPostedToTheStoreAndTheOthersFinish) {
  const RunResult run = chorusRun("--elastic --devices cpu,cpu,cpu", testWorker("elastic 1"));
  EXPECT_EQ(run.exit_code, 0) << run.output;
  const std::string logged = killedPid(run.output, "chorus run: lost ", 1);
  ASSERT_FALSE(logged.empty()) << run.output;
  EXPECT_NE(run.output.find("(SIGKILL): elastic, the others go on"), std::string::npos)
      << run.output;
  for (int survivor : {0, 2})
    EXPECT_EQ(killedPid(run.output,
                        "\\[rank " + std::to_string(survivor) + "\\] rank " +
                            std::to_string(survivor) + " saw elastic/exited/1: ",
                        1),
              logged)
        << run.output;
  EXPECT_NE(run.output.find("1 of 3 workers on this node were lost; the others finished"),
            std::string::npos)
      << run.output;
}

TEST(ElasticAgentMultiproc, EveryWorkerFailingExits3) {
  const RunResult run = chorusRun("--elastic --devices cpu,cpu", "sh -c 'exit 4'");
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_TRUE(std::regex_search(
      run.output, std::regex("every worker failed; the last: rank [01] \\(pid [0-9]+\\) exited "
                             "with code 4")))
      << run.output;
  EXPECT_NE(run.output.find("chorus run: lost rank 0 "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("chorus run: lost rank 1 "), std::string::npos) << run.output;
}

// Two agents on this host play two nodes of 2 workers each. Both of node 0's workers are lost:
// node 1's agent must not stop its workers, which learn of both losses from the store node 0's
// agent keeps up for them; node 0 exits 3 (its workers failed), node 1 exits 0.
TEST(ElasticAgentMultiproc, NodeWhoseWorkersAreAllLostKeepsTheStoreForTheOthers) {
  const std::string secret = ::testing::TempDir() + "/elastic_nodes.secret";
  ASSERT_EQ(
      system(("printf 'elastic-node-test-secret-012345' > " + secret + " && chmod 600 " + secret)
                 .c_str()),
      0);
  const std::string common =
      " --elastic --nnodes 2 --rdzv-endpoint 127.0.0.1:" + std::to_string(30400 + getpid() % 500) +
      " --secret-file " + secret + " --devices cpu,cpu";
  RunResult node1;
  std::thread second(
      [&] { node1 = chorusRun("--node-rank 1" + common, testWorker("elastic 0,1")); });
  const RunResult node0 = chorusRun("--node-rank 0" + common, testWorker("elastic 0,1"));
  second.join();
  EXPECT_EQ(node0.exit_code, 3) << node0.output;
  EXPECT_NE(node0.output.find("every worker failed; the last: rank "), std::string::npos)
      << node0.output;
  EXPECT_EQ(node1.exit_code, 0) << node1.output;
  for (int survivor : {2, 3}) {
    const std::string prefix = "\\[rank " + std::to_string(survivor) + "\\] rank " +
                               std::to_string(survivor) + " saw elastic/exited/";
    EXPECT_EQ(killedPid(node1.output, prefix + "0: ", 0), killedPid(node0.output, "lost ", 0))
        << node1.output;
    EXPECT_EQ(killedPid(node1.output, prefix + "1: ", 1), killedPid(node0.output, "lost ", 1))
        << node1.output;
  }
  EXPECT_FALSE(killedPid(node0.output, "lost ", 0).empty()) << node0.output;
  EXPECT_FALSE(killedPid(node0.output, "lost ", 1).empty()) << node0.output;
}

}  // namespace
}  // namespace chorus::runtime
