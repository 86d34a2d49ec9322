// Private to runtime: what one rank's Trainer holds, and the helpers its files share.
#pragma once

#include <torch/optim.h>

#include <memory>

#include "chorus/data/dataset.h"
#include "chorus/data/sampler.h"
#include "chorus/device/speed_emulator.h"
#include "chorus/model/zoo_model.h"
#include "chorus/parallel/gradient_reducer.h"
#include "chorus/plan/balancer.h"
#include "chorus/runtime/trainer.h"

namespace chorus::runtime {

struct TrainingData {
  std::shared_ptr<data::Dataset> train;
  std::shared_ptr<data::Dataset> test;
};

// Builds the job's datasets and fits the model config to them (classes, vocabulary, shapes).
TrainingData makeTrainingData(const JobConfig& job, model::ModelConfig& model);

// The optimizer of the job over `parameters`, and its learning rate at `step`.
std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const OptimizerSection& options,
                                                       std::vector<at::Tensor> parameters);
double learningRateAt(const OptimizerSection& options, std::int64_t step, std::int64_t steps);
void setLearningRate(torch::optim::Optimizer& optimizer, double lr);

// Largest micro-batch that fits `budget_bytes` for this model and optimizer (0 = no budget given:
// unlimited). Throws ConfigError when not even one sample fits.
std::int64_t maxMicroBatch(const model::ZooModel& model, const OptimizerSection& optimizer,
                           std::uint64_t budget_bytes, const std::string& device);

struct Trainer::State {
  JobConfig job;
  std::shared_ptr<Worker> worker;
  TrainingData data;
  std::unique_ptr<data::GlobalSampler> sampler;
  std::shared_ptr<model::ZooModel> model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<parallel::GradientReducer> reducer;
  std::unique_ptr<plan::LoadBalancer> balancer;
  device::SpeedEmulator* emulator = nullptr;              // the worker's, or speed_override's
  std::unique_ptr<device::SpeedEmulator> speed_override;  // set by TrainerHooks::speed_at
  double speed = 1.0;
  std::int64_t micro_limit = 0;  // max samples per micro-batch on this rank (0: none)
  std::int64_t next_step = 0;
};

}  // namespace chorus::runtime
