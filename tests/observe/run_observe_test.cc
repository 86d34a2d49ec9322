// How `chorus run` asks its workers for metrics and a timeline (observe/run_observe.h): the
// request survives the environment, a process another launcher started refuses it, and the
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

TEST(RunObserve, AProcessAnotherLauncherStartedRefusesTheRequest) {
  EXPECT_THROW(observeRequestFromEnvironment({{kTraceVariable, "/tmp/t.json"}}, "none"),
               ConfigError);
  for (const char* launcher : {"mpirun", "srun", "torchrun"}) {
    try {
      observeRequestFromEnvironment({{kMetricsSocketVariable, "/tmp/s"}}, launcher);
      FAIL() << launcher;
    } catch (const ConfigError& error) {
      EXPECT_NE(std::string(error.what()).find(std::string("started by ") + launcher),
                std::string::npos)
          << error.what();
    }
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
