// Shared by the pipeline tests: ranks as threads over one in-memory store, the GPT and CNN jobs,
// and single-process reference training.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "chorus/comm/communicator.h"
#include "chorus/comm/store/memory_store.h"
#include "chorus/data/synthetic.h"
#include "chorus/model/model_config.h"
#include "chorus/parallel/pipeline.h"

namespace chorus::parallel::testing {

// Runs `body(communicator)` on `size` threads, one rank each; rethrows the first failure.
inline void runRanks(int size,
                     const std::function<void(std::shared_ptr<comm::Communicator>)>& body) {
  auto store = std::make_shared<comm::MemoryStore>();
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(size);
  for (int rank = 0; rank < size; ++rank)
    threads.emplace_back([&, rank] {
      try {
        body(comm::Communicator::create(store, rank, size));
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  for (auto& thread : threads) thread.join();
  for (auto& error : errors)
    if (error) std::rethrow_exception(error);
}

// A small training job: model, data and SGD with momentum.
struct Job {
  model::ModelConfig model;
  std::int64_t global_batch = 32;
  int steps = 10;
  double lr = 0.03;
  double momentum = 0.9;
  std::uint64_t seed = 5;
};

inline Job gptJob() {
  Job job;
  job.model.kind = "gpt";
  job.model.vocab = 16;
  job.model.layers = 4;
  job.model.width = 32;
  job.model.heads = 2;
  job.model.context = 16;
  return job;
}

inline Job cnnJob() {
  Job job;
  job.model.kind = "cnn";
  job.model.input_shape = {1, 12, 12};
  job.model.channels = 8;
  job.model.blocks = 2;
  job.model.groups = 4;
  job.lr = 0.05;
  return job;
}

// Global batch `step` of the job: consecutive samples of a synthetic dataset.
inline data::Batch globalBatch(const Job& job, int step) {
  std::vector<std::int64_t> ids;
  for (std::int64_t i = 0; i < job.global_batch; ++i) ids.push_back(step * job.global_batch + i);
  if (job.model.kind == "gpt")
    return data::SyntheticTokens(4096, job.model.context, job.model.vocab, job.seed).get(ids);
  return data::SyntheticClassification(4096, job.model.input_shape, job.model.classes, job.seed)
      .get(ids);
}

using NamedTensors = std::map<std::string, at::Tensor>;

// Parameters of layers [first, last) of `model` by name, detached copies.
inline NamedTensors layerParameters(model::ZooModel& model, int first, int last) {
  const auto profile = model.profile();
  NamedTensors named;
  for (const auto& item : model.named_parameters(/*recurse=*/true))
    for (int l = first; l < last; ++l)
      if (item.key().rfind(profile[l].name + ".", 0) == 0)
        named[item.key()] = item.value().detach().clone();
  return named;
}

// Single-process training on the whole global batch: backward of the summed loss, divided by B.
inline NamedTensors trainReference(const Job& job) {
  auto model = model::makeModel(job.model, job.seed);
  torch::optim::SGD optimizer(model->parameters(),
                              torch::optim::SGDOptions(job.lr).momentum(job.momentum));
  for (int step = 0; step < job.steps; ++step) {
    const data::Batch batch = globalBatch(job, step);
    optimizer.zero_grad();
    model->lossSum(model->forward(batch.inputs), batch.targets).backward();
    for (const at::Tensor& parameter : model->parameters())
      parameter.mutable_grad().div_(static_cast<double>(job.global_batch));
    optimizer.step();
  }
  return layerParameters(*model, 0, static_cast<int>(model->numLayers()));
}

// The largest ||a - b|| / ||b|| over the tensors of `reference` (L2 per tensor).
inline double maxRelativeDifference(const NamedTensors& result, const NamedTensors& reference) {
  double worst = 0;
  for (const auto& [name, expected] : reference) {
    const auto found = result.find(name);
    if (found == result.end()) {
      ADD_FAILURE() << "no result for parameter " << name;
      return 1e300;
    }
    const double scale = std::max(expected.norm().item<double>(), 1e-12);
    worst = std::max(worst, (found->second - expected).norm().item<double>() / scale);
  }
  return worst;
}

// What one pipeline rank returns after training.
struct RankResult {
  StagePosition position;
  NamedTensors parameters;
  std::vector<PipelineStepStats> steps;
};

// Trains `job` with a pipeline of `options` (global_batch is set from the job) on threads, one
// per rank; `cuts` from stageCuts on the job's model. `configure(rank, resources)` may add an
// emulator or a memory account.
inline std::vector<RankResult> trainPipeline(
    const Job& job, PipelineOptions options,
    const std::function<void(int, PipelineResources&)>& configure = nullptr) {
  options.global_batch = job.global_batch;
  const PipelineLayout layout(options.replicas, options.pipeline_stages);
  std::vector<RankResult> results(layout.worldSize());
  runRanks(layout.worldSize(), [&](std::shared_ptr<comm::Communicator> world) {
    auto model = model::makeModel(job.model, job.seed);
    CutRequest cut;
    cut.profile = model->profile();
    cut.options = options;
    PipelineResources resources;
    resources.world = world;
    if (configure) configure(world->rank(), resources);
    PipelineEngine engine(model, options, stageCuts(cut), resources);
    torch::optim::SGD optimizer(engine.parameters(),
                                torch::optim::SGDOptions(job.lr).momentum(job.momentum));
    const std::vector<std::int64_t> shares = replicaShares(options);
    std::int64_t offset = 0;
    for (int r = 0; r < engine.position().replica; ++r) offset += shares[r];
    const std::int64_t share = shares[engine.position().replica];
    RankResult& result = results[world->rank()];
    for (int step = 0; step < job.steps; ++step) {
      const data::Batch batch = globalBatch(job, step);
      result.steps.push_back(engine.step(batch.inputs.narrow(0, offset, share),
                                         batch.targets.narrow(0, offset, share)));
      optimizer.step();
    }
    result.position = engine.position();
    result.parameters = layerParameters(*model, engine.firstLayer(), engine.lastLayer());
  });
  return results;
}

}  // namespace chorus::parallel::testing
