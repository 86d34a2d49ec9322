// What the elastic multi-process tests share: a `chorus train` job run with an injected fault
// (CHORUS_FAULT), its JSON log split into steps and recovery events, its final model, the
// uninterrupted reference run, and the expectations every recovery must meet.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <torch/serialize.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
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
         " --set comm.bucket_mb=0.004" +
         elasticArgs() + " --set checkpoint.dir=" + dir;
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

// Continues this test process's stopped descendants (the job's stopped worker), by pid: a
// pattern would match any job's workers on the machine.
inline void continueStoppedDescendants() {
  std::map<pid_t, pid_t> parent;
  std::set<pid_t> stopped;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;  // ended meanwhile
    // pid (comm) state ppid ...: comm may hold spaces and parentheses; it ends at the last ')'.
    std::istringstream rest(line.substr(line.rfind(')') + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    const auto pid = static_cast<pid_t>(std::stol(name));
    parent[pid] = ppid;
    if (state == 'T') stopped.insert(pid);
  }
  for (pid_t pid : stopped) {
    for (pid_t up = parent[pid]; up > 1; up = parent.count(up) ? parent[up] : 0) {
      if (up != getpid()) continue;
      ::kill(pid, SIGCONT);
      break;
    }
  }
}

// Continues the stopped descendants from the moment the job's log (`log`) holds `event` (by
// default a recovery's) or a minute has passed, so that a failed recovery cannot hang the test,
// until the guard is destroyed: a worker that stops itself after the event (a replacement held at
// its join) is continued too. In a thread of its own, which the destructor joins.
class ContinueAfterRecovery {
 public:
  explicit ContinueAfterRecovery(const std::string& log, const std::string& event = "\"recovery\"")
      : thread_([this, log, event] {
          const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
          while (!done_.load() && std::chrono::steady_clock::now() < until) {
            std::ifstream in(log);
            std::string text((std::istreambuf_iterator<char>(in)), {});
            if (text.find(event) != std::string::npos) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          }
          do {
            continueStoppedDescendants();
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          } while (!done_.load());
        }) {}
  ~ContinueAfterRecovery() {
    done_.store(true);
    thread_.join();
  }

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

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
