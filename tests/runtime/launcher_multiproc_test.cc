// End-to-end tests of `chorus run`: real worker processes, a real agent, the real store.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <regex>
#include <string>

#include "chorus/core/clock.h"

namespace {

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
  double seconds = 0;
};

// Runs `chorus run <run_args> -- test_worker <worker_args>` and captures everything it prints.
RunResult chorusRun(const std::string& run_args, const std::string& worker_args) {
  const std::string command = std::string(CHORUS_BINARY) + " run " + run_args + " -- " +
                              CHORUS_TEST_WORKER + " " + worker_args + " 2>&1";
  chorus::Stopwatch clock;
  RunResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return result;
  std::array<char, 4096> buffer;
  size_t got;
  while ((got = fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    result.output.append(buffer.data(), got);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.seconds = clock.seconds();
  return result;
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
  EXPECT_NE(run.output.find("[rank 1] identity rank=1 world=3 local=1 node=0 device=cpu@0.5"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("[rank 2] identity rank=2 world=3 local=2 node=0 device=cpu/256M"),
            std::string::npos)
      << run.output;
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
  EXPECT_NE(run.output.find("all_reduce #1"), std::string::npos) << run.output;
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
  EXPECT_NE(run.output.find("REFUSED"), std::string::npos) << run.output;
}

TEST(LauncherMultiproc, UnknownFlagAndBadSpecAreUsageErrors) {
  EXPECT_EQ(chorusRun("--bogus", "identity").exit_code, 2);
  const RunResult run = chorusRun("--devices gpu:0", "identity");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.output.find("invalid device spec 'gpu:0'"), std::string::npos) << run.output;
}

}  // namespace
