// Running the `chorus` binary from multi-process tests: one command line in, its exit code and
// everything it printed out, and (for `chorus train`) the per-step JSON log it wrote.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "chorus/core/clock.h"

namespace chorus::testing {

// The `--set` arguments that make a test's job elastic, with its heartbeat period: 200 ms, and 1 s
// under ThreadSanitizer, where four instrumented workers on two cores can starve a live rank's
// monitor thread past three periods and get it left out for a loss it did not suffer. Only the
// period scales with the build; what the tests assert does not.
#if defined(__SANITIZE_THREAD__)
inline constexpr int kElasticHeartbeatMs = 1000;
#else
inline constexpr int kElasticHeartbeatMs = 200;
#endif
inline std::string elasticArgs() {
  return " --set elastic.enabled=true --set elastic.heartbeat_ms=" +
         std::to_string(kElasticHeartbeatMs);
}

struct CommandResult {
  int exit_code = -1;  // -1 when it could not start or was killed by a signal
  std::string output;  // stdout and stderr together
  double seconds = 0;
};

// Runs `command` through the shell, stderr folded into stdout.
inline CommandResult runCommand(const std::string& command) {
  Stopwatch clock;
  CommandResult result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
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

struct TrainRun : CommandResult {
  std::vector<nlohmann::json> steps;  // the --log-json lines, in order
};

// `run` printed `text` somewhere in its output.
inline void expectSays(const CommandResult& run, const std::string& text) {
  EXPECT_NE(run.output.find(text), std::string::npos) << run.output;
}

// `run` stopped before any step with a ConfigError (exit code 2) whose message holds `message`.
inline void expectRefused(const CommandResult& run, const std::string& message) {
  EXPECT_EQ(run.exit_code, 2) << run.output;
  expectSays(run, message);
}

// Runs `chorus train <args> --log-json <temp>/<name>.jsonl` and reads the log back.
inline TrainRun chorusTrain(const std::string& args, const std::string& name) {
  const std::string log = ::testing::TempDir() + "/" + name + ".jsonl";
  std::remove(log.c_str());
  TrainRun run;
  static_cast<CommandResult&>(run) =
      runCommand(std::string(CHORUS_BINARY) + " train " + args + " --log-json " + log);
  std::ifstream lines(log);
  std::string line;
  while (std::getline(lines, line)) run.steps.push_back(nlohmann::json::parse(line));
  return run;
}

// Runs `chorus run <run_args> -- <worker_command>`.
inline CommandResult chorusRun(const std::string& run_args, const std::string& worker_command) {
  return runCommand(std::string(CHORUS_BINARY) + " run " + run_args + " -- " + worker_command);
}

// The test worker program (tests/worker/test_worker.cc) with `args`.
inline std::string testWorker(const std::string& args) {
  return std::string(CHORUS_TEST_WORKER) + " " + args;
}

// The pid in "rank 1 (pid 4711) was killed by signal 9 (SIGKILL)" (WorkerExit::describe()) after
// `context`, or "" when `output` has no such line.
inline std::string killedPid(const std::string& output, const std::string& context, int rank) {
  std::smatch match;
  const std::regex pattern(context + "rank " + std::to_string(rank) +
                           " \\(pid ([0-9]+)\\) was killed by signal 9 \\(SIGKILL\\)");
  return std::regex_search(output, match, pattern) ? match[1].str() : "";
}

}  // namespace chorus::testing
