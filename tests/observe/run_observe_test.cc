// How `chorus run` asks its workers for metrics and a timeline (observe/run_observe.h): the
// request survives the environment, a process another launcher started refuses the agent's socket
// and takes the user's CHORUS_METRICS_PORT and CHORUS_TRACE (refused under chorus run), and the
// agent merges exactly the parts of its trace and removes them.
#include "chorus/observe/run_observe.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "chorus/core/error.h"

namespace chorus::observe {
namespace {

TEST(RunObserve, TheRequestSurvivesTheEnvironment) {
  ObserveRequest request;
  EXPECT_TRUE(observeEnvironment(request).empty());
  request.metrics_socket = "/tmp/chorus-metrics-x/socket";
  request.trace = "/tmp/run.json";
  request.trace_steps = {3, 9};
  auto environment = observeEnvironment(request);
  EXPECT_EQ(environment.at(kTraceStepsVariable), "3:9");
  const ObserveRequest back = observeRequestFromEnvironment(environment, "chorus");
  EXPECT_EQ(back.metrics_socket, request.metrics_socket);
  EXPECT_EQ(back.trace, request.trace);
  EXPECT_EQ(back.trace_steps.first, 3);
  EXPECT_EQ(back.trace_steps.end, 9);
  EXPECT_FALSE(observeRequestFromEnvironment({}, "mpirun").any());
  environment[kTraceStepsVariable] = "9:3";
  EXPECT_THROW(observeRequestFromEnvironment(environment, "chorus"), ConfigError);
}

TEST(RunObserve, AProcessAnotherLauncherStartedRefusesTheAgentsSocket) {
  for (const char* launcher : {"mpirun", "srun", "torchrun", "none"}) {
    try {
      observeRequestFromEnvironment({{kMetricsSocketVariable, "/tmp/s"}}, launcher);
      FAIL() << launcher;
    } catch (const ConfigError& error) {
      const std::string said =
          std::string("started by ") + (launcher == std::string("none") ? "no launcher" : launcher);
      EXPECT_NE(std::string(error.what()).find(said), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find(kMetricsPortVariable), std::string::npos)
          << error.what();
    }
  }
}

TEST(RunObserve, AJobWithoutAnAgentAsksThroughItsOwnVariables) {
  for (const char* launcher : {"mpirun", "srun", "torchrun", "none"}) {
    const ObserveRequest request = observeRequestFromEnvironment({{kMetricsPortVariable, "9400"},
                                                                  {kTraceVariable, "/tmp/t.json"},
                                                                  {kTraceStepsVariable, "2:6"}},
                                                                 launcher);
    EXPECT_EQ(request.metrics_port, 9400) << launcher;
    EXPECT_TRUE(request.metrics_socket.empty());
    EXPECT_EQ(request.trace, "/tmp/t.json");
    EXPECT_EQ(request.trace_steps.first, 2);
    EXPECT_EQ(request.trace_steps.end, 6);
    EXPECT_EQ(request.node, -1);
    EXPECT_TRUE(request.any());
  }
  EXPECT_EQ(observeRequestFromEnvironment({{kMetricsPortVariable, "0"}}, "mpirun").metrics_port, 0);
  EXPECT_TRUE(observeRequestFromEnvironment({{kTraceVariable, "/tmp/t.json"}}, "srun").any());
  EXPECT_EQ(observeRequestFromEnvironment({}, "srun").metrics_port, -1);
  for (const char* port : {"-1", "65536", "94OO", "9400 "})
    EXPECT_THROW(observeRequestFromEnvironment({{kMetricsPortVariable, port}}, "mpirun"),
                 ConfigError)
        << port;
  // Steps without a trace limit nothing.
  EXPECT_THROW(observeRequestFromEnvironment({{kTraceStepsVariable, "0:4"}}, "mpirun"),
               ConfigError);
}

TEST(RunObserve, UnderChorusRunThePortIsTheAgentsOption) {
  try {
    observeRequestFromEnvironment({{kMetricsPortVariable, "9400"}}, "chorus");
    FAIL();
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("chorus run --metrics-port 9400"), std::string::npos)
        << error.what();
  }
}

TEST(RunObserve, MergesOnlyTheTracesPartsAndRemovesThem) {
  const auto dir = std::filesystem::temp_directory_path() / "chorus-run-observe-test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string trace = (dir / "run.json").string();
  EXPECT_EQ(mergeTraceOf(trace), 0);
  EXPECT_FALSE(std::filesystem::exists(trace));
  for (int rank : {0, 1}) {
    TraceRecorder recorder(rank, 0, "rank " + std::to_string(rank), {0, 2});
    recorder.setStep(0);
    const auto now = TraceRecorder::Clock::now();
    recorder.span(Track::kCompute, "forward", "compute", now, now + std::chrono::milliseconds(1));
    recorder.writePart(tracePartPath(trace, rank));
  }
  std::ofstream(dir / "run.json.rank1.tmp") << "not a part";
  std::ofstream(dir / "other.json.rank0") << "not this trace's";
  EXPECT_EQ(traceParts(trace).size(), 2u);
  EXPECT_EQ(mergeTraceOf(trace), 2);
  EXPECT_TRUE(traceParts(trace).empty());
  std::ifstream merged(trace);
  const auto json = nlohmann::json::parse(merged);
  int spans = 0;
  for (const auto& event : json.at("traceEvents")) spans += event.at("ph") == "X";
  EXPECT_EQ(spans, 2);
  EXPECT_TRUE(std::filesystem::exists(dir / "other.json.rank0"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace chorus::observe
