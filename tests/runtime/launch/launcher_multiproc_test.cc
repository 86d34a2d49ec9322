// End-to-end tests of `chorus run`: real worker processes, a real agent, the real store.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "chorus/core/clock.h"

#include "runtime/chorus_cli.h"

namespace {

using chorus::testing::expectSays;

using RunResult = chorus::testing::CommandResult;

// Runs `chorus run <run_args> -- test_worker <worker_args>` and captures everything it prints.
RunResult chorusRun(const std::string& run_args, const std::string& worker_args) {
  return chorus::testing::runCommand(std::string(CHORUS_BINARY) + " run " + run_args + " -- " +
                                     CHORUS_TEST_WORKER + " " + worker_args);
}

int countOf(const std::string& text, const std::string& needle) {
  int count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1))
    ++count;
  return count;
}

TEST(LauncherMultiproc, HandsEachWorkerItsIdentityAndPrefixesOutput) {
  const RunResult run = chorusRun("--devices cpu,cpu@0.5,cpu/256MiB", "identity");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(
      run.output.find("[rank 0] identity rank=0 world=3 local=0 node=0 device=cpu launcher=chorus"),
      std::string::npos)
      << run.output;
  expectSays(run, "[rank 1] identity rank=1 world=3 local=1 node=0 device=cpu@0.5");
  expectSays(run, "[rank 2] identity rank=2 world=3 local=2 node=0 device=cpu/256M");
}

class CollectivesMultiproc : public testing::TestWithParam<int> {};

TEST_P(CollectivesMultiproc, EveryCollectiveIsExact) {
  const int ranks = GetParam();
  std::string devices = "cpu";
  for (int rank = 1; rank < ranks; ++rank) devices += ",cpu";
  const RunResult run = chorusRun("--devices " + devices + " --timeout 60", "collectives");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(countOf(run.output, "collectives ok"), ranks) << run.output;
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectivesMultiproc, testing::Values(2, 3, 4));

TEST(LauncherMultiproc, AbsentRankIsNamedWithinTheDeadline) {
  const RunResult run = chorusRun("--devices cpu,cpu,cpu --timeout 2", "absent 1");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(countOf(run.output, "ranks not arrived: 1"), 2) << run.output;
  expectSays(run, "all_reduce #1");
}

TEST(LauncherMultiproc, CrashingWorkerStopsTheJobAndIsNamed) {
  const RunResult run = chorusRun("--devices cpu,cpu,cpu --grace 2", "crash 2");
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_TRUE(
      std::regex_search(run.output, std::regex("rank 2 \\(pid [0-9]+\\) was killed by signal 11")))
      << run.output;
  // The survivors sleep 60 s unless stopped: the agent must have stopped them promptly.
  EXPECT_LT(run.seconds, 20.0) << run.output;
}

TEST(LauncherMultiproc, WrongSecretIsRefusedFast) {
  const RunResult run = chorusRun("--devices cpu,cpu", "intruder");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  expectSays(run, "REFUSED");
}

// Two agents on this host play two nodes of 2 workers each, meeting at one endpoint with a shared
// secret file: ranks are numbered node by node and collectives span both nodes.
TEST(LauncherMultiproc, TwoNodesMeetAtTheEndpointAndComputeTogether) {
  const std::string secret = testing::TempDir() + "/two_nodes.secret";
  ASSERT_EQ(
      system(("printf 'two-node-test-secret-0123456789' > " + secret + " && chmod 600 " + secret)
                 .c_str()),
      0);
  const std::string common =
      " --nnodes 2 --rdzv-endpoint 127.0.0.1:" + std::to_string(29400 + getpid() % 500) +
      " --secret-file " + secret + " --devices cpu,cpu --timeout 60";
  RunResult node1;
  std::thread second([&] { node1 = chorusRun("--node-rank 1" + common, "collectives"); });
  const RunResult node0 = chorusRun("--node-rank 0" + common, "collectives");
  second.join();
  ASSERT_EQ(node0.exit_code, 0) << node0.output;
  ASSERT_EQ(node1.exit_code, 0) << node1.output;
  EXPECT_EQ(countOf(node0.output + node1.output, "collectives ok"), 4);
  EXPECT_NE(node1.output.find("[rank 3] collectives ok rank 3"), std::string::npos) << node1.output;
}

TEST(LauncherMultiproc, SeveralNodesNeedASecretFile) {
  const RunResult run =
      chorusRun("--nnodes 2 --rdzv-endpoint 127.0.0.1:1 --devices cpu", "identity");
  EXPECT_EQ(run.exit_code, 2);
  expectSays(run, "--secret-file");
}

// SIGTERM to the agent stops every worker (none is left behind) and the agent exits 128 + 15.
TEST(LauncherMultiproc, TerminatingTheAgentStopsEveryWorker) {
  const std::string command =
      std::string(CHORUS_BINARY) + " run --devices cpu,cpu -- " + CHORUS_TEST_WORKER + " sleep";
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t agent = fork();
  if (agent == 0) {
    dup2(out[1], 1);
    dup2(out[1], 2);
    execl("/bin/sh", "sh", "-c", ("exec " + command).c_str(), nullptr);
    _exit(127);
  }
  close(out[1]);
  std::string output;
  std::vector<int> pids;
  char buffer[4096];
  const std::regex pid_line("pid=([0-9]+)");
  while (pids.size() < 2) {
    const ssize_t got = read(out[0], buffer, sizeof buffer);
    ASSERT_GT(got, 0) << output;
    output.append(buffer, got);
    pids.clear();
    for (auto it = std::sregex_iterator(output.begin(), output.end(), pid_line);
         it != std::sregex_iterator(); ++it)
      pids.push_back(std::stoi((*it)[1]));
  }
  chorus::Stopwatch clock;
  kill(agent, SIGTERM);
  int status = 0;
  waitpid(agent, &status, 0);
  while (read(out[0], buffer, sizeof buffer) > 0) {
  }
  close(out[0]);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM) << output;
  EXPECT_LT(clock.seconds(), 6.0);
  for (int pid : pids) EXPECT_NE(kill(pid, 0), 0) << "worker " << pid << " survived the agent";
}

TEST(LauncherMultiproc, UnknownFlagAndBadSpecAreUsageErrors) {
  EXPECT_EQ(chorusRun("--bogus", "identity").exit_code, 2);
  const RunResult run = chorusRun("--devices gpu:0", "identity");
  EXPECT_EQ(run.exit_code, 2);
  expectSays(run, "invalid device spec 'gpu:0'");
}

}  // namespace
