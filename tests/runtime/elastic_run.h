// What the elastic multi-process tests share: a `chorus train` job run with an injected fault
// (CHORUS_FAULT), its JSON log split into steps and recovery events, its final model, the
// uninterrupted reference run, and the expectations every recovery must meet.
#pragma once

#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "checkpoint_model.h"
#include "chorus/runtime/checkpoint/checkpoint.h"
#include "chorus_cli.h"

namespace chorus::testing {

constexpr int kSteps = 16;

inline std::string jobArgs(const std::string& devices, const std::string& dir) {
  return "--set devices=" + devices +
         " --set balance=off --set model.kind=mlp --set 'model.hidden=[64, 32]'"
         " --set data.dataset=synthetic --set data.size=4096 --set train.global_batch=120"
         " --set train.steps=" +
         std::to_string(kSteps) +
         " --set train.eval_every=0 --set train.eval_samples=256"
         " --set train.target_accuracy=0 --set optimizer.name=adamw --set optimizer.lr=0.003"
         " --set comm.bucket_mb=0.004 --set elastic.enabled=true --set elastic.heartbeat_ms=200"
         " --set checkpoint.dir=" +
         dir;
}

struct ElasticRun {
  TrainRun run;
  std::vector<nlohmann::json> steps;       // the step objects of the log, in order
  std::vector<nlohmann::json> recoveries;  // its recovery events
  std::map<std::string, at::Tensor> model;
};

inline std::map<std::string, at::Tensor> finalModel(const std::string& dir) {
  const auto checkpoints = runtime::listCheckpoints(dir);
  if (checkpoints.empty()) return {};
  return checkpointModel(dir + "/" + checkpoints.front());
}

// Runs the job with CHORUS_FAULT=`fault` on `devices`.
inline ElasticRun runElastic(const std::string& name, const std::string& devices,
                             const std::string& fault, const std::string& extra = "") {
  const std::string dir = ::testing::TempDir() + "/chorus_elastic_" + name;
  std::filesystem::remove_all(dir);
  ElasticRun result;
  const std::string log = ::testing::TempDir() + "/" + name + ".jsonl";
  std::remove(log.c_str());
  static_cast<CommandResult&>(result.run) =
      runCommand("CHORUS_FAULT='" + fault + "' " + std::string(CHORUS_BINARY) + " train " +
                 jobArgs(devices, dir) + " " + extra + " --log-json " + log);
  std::ifstream lines(log);
  std::string line;
  while (std::getline(lines, line)) {
    const nlohmann::json json = nlohmann::json::parse(line);
    (json.contains("event") ? result.recoveries : result.steps).push_back(json);
  }
  result.model = finalModel(dir);
  return result;
}

// The uninterrupted run on the same devices with the same `extra` settings, once per test
// program.
inline const ElasticRun& reference(const std::string& devices, const std::string& extra = "") {
  static std::map<std::string, ElasticRun> runs;
  const std::string key = devices + " " + extra;
  auto found = runs.find(key);
  if (found == runs.end())
    // Named after this process too: ctest -j2 runs two tests of this program at once, each
    // in a process of its own, and their references must not share a checkpoint directory.
    found = runs.emplace(key, runElastic("reference_" + std::to_string(getpid()) + "_" +
                                             std::to_string(runs.size()),
                                         devices, "", extra))
                .first;
  return found->second;
}

inline void expectEveryStepOnce(const ElasticRun& run) {
  ASSERT_EQ(static_cast<int>(run.steps.size()), kSteps) << run.run.output;
  for (int i = 0; i < kSteps; ++i) EXPECT_EQ(run.steps[i].at("step").get<int>(), i + 1);
}

inline void expectSameModel(const ElasticRun& run, const ElasticRun& straight) {
  ASSERT_FALSE(straight.model.empty()) << straight.run.output;
  ASSERT_EQ(run.model.size(), straight.model.size()) << run.run.output;
  for (const auto& [name, expected] : straight.model) {
    const at::Tensor& got = run.model.at(name);
    const double scale = expected.abs().max().item<double>();
    const double difference = (got - expected).abs().max().item<double>();
    EXPECT_LE(difference, 1e-6 * std::max(scale, 1e-12)) << name;
  }
}

inline void expectRecovered(const ElasticRun& run, const std::vector<int>& members,
                            const std::vector<int>& lost) {
  EXPECT_EQ(run.run.exit_code, 0) << run.run.output;
  ASSERT_FALSE(run.recoveries.empty()) << run.run.output;
  const nlohmann::json& last = run.recoveries.back();
  EXPECT_EQ(last.at("members").get<std::vector<int>>(), members) << last.dump();
  std::vector<int> all_lost;
  for (const auto& recovery : run.recoveries)
    for (int member : recovery.at("lost").get<std::vector<int>>()) all_lost.push_back(member);
  std::sort(all_lost.begin(), all_lost.end());
  EXPECT_EQ(all_lost, lost);
}

}  // namespace chorus::testing
