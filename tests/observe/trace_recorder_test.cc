// TraceRecorder: only the steps asked for are kept, parts are valid trace-event arrays, and a
// merged trace is one Chrome trace-event object with one process per node, two tracks per rank
// and times relative to its first span.
#include "chorus/observe/trace_recorder.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chorus/core/error.h"

namespace chorus::observe {
namespace {

using Clock = TraceRecorder::Clock;
using Json = nlohmann::json;

Json readJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return Json::parse(text.str());
}

TEST(TraceSteps, ParsesARangeAndRefusesAnythingElse) {
  const TraceSteps steps = parseTraceSteps("3:7");
  EXPECT_EQ(steps.first, 3);
  EXPECT_EQ(steps.end, 7);
  for (const char* bad : {"", "3", "7:3", "3:3", "-1:4", "a:4", "1:4x", ":4", "1:"})
    EXPECT_THROW(parseTraceSteps(bad), ConfigError) << bad;
}

TEST(TraceRecorder, KeepsOnlyTheStepsOfItsRange) {
  TraceRecorder trace(1, 0, "rank 1 (cpu@0.5)", {2, 4});
  const auto start = Clock::now();
  for (std::int64_t step = 0; step < 6; ++step) {
    trace.setStep(step);
    EXPECT_EQ(trace.recording(), step >= 2 && step < 4) << step;
    trace.span(Track::kCompute, "forward", "compute", start, start + std::chrono::milliseconds(1));
  }
  const auto spans = trace.spans();
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].step, 2);
  EXPECT_EQ(spans[1].step, 3);
  // An end before the start (clock read on two threads) becomes an empty span, never negative.
  trace.setStep(3);
  trace.span(Track::kComm, "all_reduce bucket 0", "allreduce", start,
             start - std::chrono::seconds(1));
  EXPECT_EQ(trace.spans().back().end, start);
}

TEST(TraceRecorder, APartNamesItsTracksAndHoldsItsSpans) {
  TraceRecorder trace(2, 1, "rank 2 (cpu)", {0, 1});
  trace.setStep(0);
  const auto start = Clock::now();
  trace.span(Track::kComm, "all_reduce bucket 0", "allreduce", start,
             start + std::chrono::microseconds(250));
  const Json part = Json::parse(trace.partJson());
  ASSERT_TRUE(part.is_array());
  int names = 0;
  for (const Json& event : part) {
    EXPECT_EQ(event["pid"], 1);
    if (event["ph"] == "M" && event["name"] == "thread_name") {
      ++names;
      EXPECT_TRUE(event["tid"] == 4 || event["tid"] == 5);
    }
    if (event["ph"] == "X") {
      EXPECT_EQ(event["tid"], 5);  // the rank's communication track
      EXPECT_EQ(event["cat"], "allreduce");
      EXPECT_NEAR(event["dur"].get<double>(), 250.0, 1.0);
      EXPECT_EQ(event["args"]["step"], 0);
      EXPECT_EQ(event["args"]["rank"], 2);
    }
  }
  EXPECT_EQ(names, 2);
}

TEST(TraceRecorder, MergedPartsAreOneTraceOnOneClock) {
  const std::string dir = ::testing::TempDir();
  const auto start = Clock::now();
  std::vector<std::string> parts;
  for (int rank = 0; rank < 2; ++rank) {
    TraceRecorder trace(rank, rank, "rank " + std::to_string(rank), {0, 5});
    trace.setStep(0);
    const auto begin = start + std::chrono::milliseconds(10 * rank);
    trace.span(Track::kCompute, "forward", "compute", begin, begin + std::chrono::milliseconds(2));
    parts.push_back(tracePartPath(dir + "/merged.json", rank));
    trace.writePart(parts.back());
  }
  EXPECT_EQ(parts[1], dir + "/merged.json.rank1");
  ASSERT_EQ(mergeTraceParts(parts, dir + "/merged.json"), 2);
  const Json trace = readJson(dir + "/merged.json");
  ASSERT_TRUE(trace["traceEvents"].is_array());
  EXPECT_EQ(trace["displayTimeUnit"], "ms");
  std::vector<double> starts;
  int processes = 0;
  for (const Json& event : trace["traceEvents"]) {
    if (event["ph"] == "X") starts.push_back(event["ts"].get<double>());
    if (event["ph"] == "M" && event["name"] == "process_name") ++processes;
  }
  ASSERT_EQ(starts.size(), 2u);
  EXPECT_EQ(processes, 2);  // one per node
  // Relative to the first span, 10 ms apart as recorded.
  EXPECT_DOUBLE_EQ(std::min(starts[0], starts[1]), 0.0);
  EXPECT_NEAR(std::max(starts[0], starts[1]), 10000.0, 1.0);
}

TEST(TraceRecorder, BadPathsAreConfigErrors) {
  EXPECT_THROW(checkTraceWritable("/nonexistent-dir/trace.json"), ConfigError);
  EXPECT_THROW(checkTraceWritable(""), ConfigError);
  const std::string fine = ::testing::TempDir() + "/probe-trace.json";
  std::remove(fine.c_str());
  checkTraceWritable(fine);
  EXPECT_FALSE(std::ifstream(fine).good());  // the probe leaves nothing behind
  EXPECT_THROW(mergeTraceParts({::testing::TempDir() + "/no-such-part"}, fine), ConfigError);
  TraceRecorder trace(0, 0, "rank 0", {});
  EXPECT_THROW(trace.writePart("/nonexistent-dir/part"), ConfigError);
}

}  // namespace
}  // namespace chorus::observe
