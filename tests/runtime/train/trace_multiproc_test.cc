// `chorus train --trace`: three real worker processes write one timeline of the steps asked for,
// in Chrome trace-event JSON, with each rank's compute and communication on its own tracks, and
// a bucket's all-reduce that starts while backward is still running on a full-speed rank; and a
// pipeline's timeline, micro-batch by micro-batch.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "runtime/chorus_cli.h"

namespace {

using chorus::testing::chorusTrain;
using chorus::testing::TrainRun;
using Json = nlohmann::json;

// A small CNN (several buckets) on synthetic data: 3 ranks, the full-speed one first.
const std::string kJob =
    " --set devices=cpu,cpu@0.5,cpu@0.5 --set model.kind=cnn --set model.channels=32"
    " --set model.blocks=2 --set model.groups=8 --set data.dataset=synthetic"
    " --set data.size=512 --set train.global_batch=48 --set train.eval_every=0"
    " --set train.eval_samples=32 --set train.target_accuracy=0 --steps 6";

Json readJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
}

// Checks the fields every event of its phase must have (the Trace Event Format's JSON Object
// Format, as Perfetto reads it).
void expectWellFormed(const Json& event) {
  ASSERT_TRUE(event.is_object());
  ASSERT_TRUE(event.contains("ph") && event["ph"].is_string()) << event;
  ASSERT_TRUE(event.contains("name") && event["name"].is_string()) << event;
  ASSERT_TRUE(event.contains("pid") && event["pid"].is_number_integer()) << event;
  ASSERT_TRUE(event.contains("tid") && event["tid"].is_number_integer()) << event;
  const std::string phase = event["ph"];
  ASSERT_TRUE(phase == "X" || phase == "M") << event;
  if (phase == "M") {
    ASSERT_TRUE(event.contains("args") && event["args"].is_object()) << event;
    return;
  }
  ASSERT_TRUE(event.contains("ts") && event["ts"].is_number()) << event;
  ASSERT_TRUE(event.contains("dur") && event["dur"].is_number()) << event;
  EXPECT_GE(event["ts"].get<double>(), 0.0) << event;
  EXPECT_GE(event["dur"].get<double>(), 0.0) << event;
  ASSERT_TRUE(event.contains("cat") && event["cat"].is_string()) << event;
}

struct Span {
  std::string name;
  double start = 0, end = 0;
};

TEST(TraceMultiproc, ThreeRanksWriteOneTimelineOfTheStepsAskedFor) {
  const std::string path = ::testing::TempDir() + "/chorus_trace.json";
  std::remove(path.c_str());
  const TrainRun run = chorusTrain(kJob + " --trace " + path + " --trace-steps 2:5", "trace");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("wrote the timeline of 3 ranks to " + path), std::string::npos)
      << run.output;
  EXPECT_FALSE(std::ifstream(path + ".rank0").good());  // the parts are merged and removed
  const Json trace = readJson(path);
  ASSERT_TRUE(trace.is_object() && trace.contains("traceEvents")) << run.output;

  std::set<int> named_tracks;
  std::set<std::int64_t> steps;
  // (rank, step) -> spans of that step on that rank
  std::map<std::pair<int, std::int64_t>, std::vector<Span>> compute, comm;
  for (const Json& event : trace["traceEvents"]) {
    expectWellFormed(event);
    if (event["ph"] == "M") {
      if (event["name"] == "thread_name") named_tracks.insert(event["tid"].get<int>());
      continue;
    }
    const int rank = event["args"]["rank"];
    const std::int64_t step = event["args"]["step"];
    steps.insert(step);
    EXPECT_EQ(event["tid"].get<int>() / 2, rank) << event;
    const bool on_comm = event["tid"].get<int>() % 2 == 1;
    const double start = event["ts"], end = start + event["dur"].get<double>();
    (on_comm ? comm : compute)[{rank, step}].push_back({event["name"], start, end});
  }
  EXPECT_EQ(named_tracks, (std::set<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(steps, (std::set<std::int64_t>{2, 3, 4}));  // bounded to --trace-steps
  bool overlapped = false;
  int emulated_pads = 0;
  for (int rank = 0; rank < 3; ++rank) {
    for (std::int64_t step = 2; step < 5; ++step) {
      const auto& mine = compute[{rank, step}];
      std::map<std::string, int> count;
      double backward_end = 0;
      for (const Span& span : mine) {
        ++count[span.name];
        if (span.name == "backward") backward_end = span.end;
      }
      EXPECT_EQ(count["forward"], 1) << rank << " " << step;
      EXPECT_EQ(count["backward"], 1) << rank << " " << step;
      EXPECT_EQ(count["optimizer"], 1) << rank << " " << step;
      // Only emulated ranks pad (their buckets go out during the padding) or wait for their
      // turn on a shared core, which counts against the padding; a step whose wall time on a
      // loaded host already reached compute / speed needs neither, so they are counted over all
      // traced steps.
      if (rank == 0) {
        EXPECT_EQ(count["pad"] + count["wait for turn"], 0) << step;
      } else {
        emulated_pads += count["pad"] + count["wait for turn"];
      }
      int buckets = 0;
      for (const Span& span : comm[{rank, step}]) {
        if (span.name.rfind("all_reduce bucket ", 0) != 0) continue;
        ++buckets;
        if (rank == 0 && span.start < backward_end) overlapped = true;
      }
      EXPECT_GE(buckets, 2) << rank << " " << step;
    }
  }
  EXPECT_GE(emulated_pads, 1);
  // The full-speed rank launches a bucket from the hooks while its backward still runs.
  EXPECT_TRUE(overlapped);
}

TEST(TraceMultiproc, AnUnwritablePathFailsBeforeTraining) {
  const TrainRun run = chorusTrain(kJob + " --trace /nonexistent-dir/trace.json", "trace_bad");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("ConfigError: --trace: cannot write '/nonexistent-dir/trace.json'"),
            std::string::npos)
      << run.output;
  EXPECT_TRUE(run.steps.empty());
}

TEST(TraceMultiproc, ABadStepRangeIsRefused) {
  const std::string path = ::testing::TempDir() + "/chorus_trace_bad.json";
  TrainRun run = chorusTrain(kJob + " --trace " + path + " --trace-steps 5:2", "trace_range");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--trace-steps: expected A:B"), std::string::npos) << run.output;
}

// A pipeline's timeline: 2 replicas x 2 stages, 4 micro-batches. Every rank shows each
// micro-batch's forward and backward once per step, stage 1 its waits for activations and stage
// 0 for gradients, every rank the replicas' all-reduce; and a micro-batch's forward on stage 1
// starts after it ended on stage 0 (one host: one clock).
TEST(TraceMultiproc, APipelineTimelineShowsEveryStagesMicroBatches) {
  const std::string path = ::testing::TempDir() + "/chorus_trace_pipeline.json";
  std::remove(path.c_str());
  const std::string job =
      " --set devices=cpu,cpu,cpu,cpu --set model.kind=mlp --set data.dataset=synthetic"
      " --set data.size=512 --set train.global_batch=32 --set train.eval_every=0"
      " --set train.eval_samples=32 --set train.target_accuracy=0 --steps 4"
      " --set parallel.pipeline_stages=2 --set parallel.replicas=2 --set parallel.micro_batches=4";
  const TrainRun run = chorusTrain(job + " --trace " + path + " --trace-steps 1:3", "trace_pipe");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const Json trace = readJson(path);
  ASSERT_TRUE(trace.is_object() && trace.contains("traceEvents")) << run.output;
  // (rank, step) -> name -> spans
  std::map<std::pair<int, std::int64_t>, std::map<std::string, std::vector<Span>>> spans;
  for (const Json& event : trace["traceEvents"]) {
    expectWellFormed(event);
    if (event["ph"] == "M") continue;
    const double start = event["ts"], end = start + event["dur"].get<double>();
    spans[{event["args"]["rank"].get<int>(), event["args"]["step"].get<std::int64_t>()}]
         [event["name"].get<std::string>()]
             .push_back({event["name"], start, end});
  }
  for (int rank = 0; rank < 4; ++rank) {
    const bool first_stage = rank % 2 == 0;
    for (std::int64_t step = 1; step < 3; ++step) {
      auto& mine = spans[{rank, step}];
      for (int m = 0; m < 4; ++m) {
        const std::string id = std::to_string(m);
        EXPECT_EQ(mine["forward " + id].size(), 1u) << rank << " " << step << " " << m;
        EXPECT_EQ(mine["backward " + id].size(), 1u) << rank << " " << step << " " << m;
        EXPECT_EQ(mine[(first_stage ? "recv gradient " : "recv activation ") + id].size(), 1u)
            << rank << " " << step << " " << m;
        if (!first_stage && !mine["forward " + id].empty()) {
          const auto& before = spans[{rank - 1, step}]["forward " + id];
          ASSERT_EQ(before.size(), 1u);
          EXPECT_GE(mine["forward " + id][0].start, before[0].end) << rank << " " << m;
        }
      }
      EXPECT_EQ(mine["all_reduce replicas"].size(), 1u) << rank << " " << step;
      EXPECT_EQ(mine["optimizer"].size(), 1u) << rank << " " << step;
    }
  }
  EXPECT_EQ(spans.count({0, 0}), 0u);  // bounded to --trace-steps
}

}  // namespace
