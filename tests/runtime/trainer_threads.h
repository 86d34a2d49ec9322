// Test helper: Trainers of one job as threads over one in-memory store.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "chorus/comm/store/memory_store.h"
#include "chorus/core/config.h"
#include "chorus/runtime/job/job_config.h"
#include "chorus/runtime/job/pipeline_job.h"
#include "chorus/runtime/launch/worker.h"
#include "chorus/runtime/train/trainer.h"

namespace chorus::runtime::testing {

// What init() takes for rank `rank` of `world` ranks that run as threads over `store`.
inline InitOptions threadRankOptions(int rank, int world, std::shared_ptr<comm::Store> store) {
  InitOptions options;
  options.environment = Environment{{"CHORUS_RANK", std::to_string(rank)},
                                    {"CHORUS_WORLD_SIZE", std::to_string(world)},
                                    {"CHORUS_RDZV_ENDPOINT", "127.0.0.1:1"},
                                    {"CHORUS_SECRET_FILE", "unused: the store is in memory"},
                                    {"CHORUS_LOG_LEVEL", "warn"}};
  options.store = std::move(store);
  return options;
}

// Runs `body(rank)` on `world` threads. Returns one error text per rank (what the rank threw, ""
// when it returned).
inline std::vector<std::string> runRankThreads(int world,
                                               const std::function<void(int rank)>& body) {
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(rank);
      } catch (const std::exception& error) {
        errors[rank] = error.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return errors;
}

// Runs `body(trainer, rank)` on `world` threads, each with a Trainer of `toml` (plus `settings`,
// as --set would apply them; a pipeline job needs world = pipeline_stages x replicas) and, when
// given, host_ids[rank] as its host. Returns one error text per rank ("" when the rank succeeded).
inline std::vector<std::string> runTrainers(const std::string& toml,
                                            const std::vector<std::string>& settings, int world,
                                            const std::function<void(Trainer&, int rank)>& body,
                                            const std::vector<std::string>& host_ids = {}) {
  auto store = std::make_shared<comm::MemoryStore>();
  return runRankThreads(world, [&](int rank) {
    Config config = Config::parseString(toml);
    for (const auto& setting : settings) config.set(setting);
    const JobConfig job = readJobConfig(config);
    InitOptions options = threadRankOptions(rank, world, store);
    if (!host_ids.empty()) (*options.environment)["CHORUS_HOST_ID"] = host_ids[rank];
    Trainer trainer(job, init(options));
    body(trainer, rank);
  });
}

// Detached copies of a pipeline rank's stage parameters, in the model's order.
inline std::vector<at::Tensor> stageParametersOf(Trainer& trainer) {
  std::vector<at::Tensor> values;
  for (const auto& parameter : trainer.parameters()) values.push_back(parameter.detach().clone());
  return values;
}

inline std::vector<at::Tensor> parametersOf(Trainer& trainer) {
  std::vector<at::Tensor> values;
  for (const auto& parameter : trainer.model().parameters())
    values.push_back(parameter.detach().clone());
  return values;
}

// The largest ||a - b|| / ||b|| over the tensors.
inline double maxRelativeDifference(const std::vector<at::Tensor>& a,
                                    const std::vector<at::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double scale = std::max(b[i].norm().item<double>(), 1e-12);
    worst = std::max(worst, (a[i] - b[i]).norm().item<double>() / scale);
  }
  return worst;
}

inline bool bitwiseEqual(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!at::equal(a[i], b[i])) return false;
  return true;
}

}  // namespace chorus::runtime::testing
