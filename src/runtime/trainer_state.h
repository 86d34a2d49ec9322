// Private to runtime: what one rank's Trainer holds, and the helpers its files share.
#pragma once

#include <torch/optim.h>

#include <functional>
#include <future>
#include <memory>
#include <optional>

#include "chorus/data/dataset.h"
#include "chorus/data/sampler.h"
#include "chorus/device/speed_emulator.h"
#include "chorus/model/zoo_model.h"
#include "chorus/parallel/compression.h"
#include "chorus/parallel/gradient_reducer.h"
#include "chorus/parallel/loss_scaler.h"
#include "chorus/parallel/precision.h"
#include "chorus/plan/balancer.h"
#include "chorus/plan/memory_model.h"
#include "chorus/runtime/checkpoint.h"
#include "chorus/runtime/trainer.h"

namespace chorus::runtime {

struct TrainingData {
  std::shared_ptr<data::Dataset> train;
  std::shared_ptr<data::Dataset> test;
};

// Builds the job's datasets and fits the model config to them (classes, vocabulary, shapes).
TrainingData makeTrainingData(const JobConfig& job, model::ModelConfig& model);

// What every trainer starts from: the job's data (fitting job.model to it), the global sampler,
// and the model built from the seed, on the worker's device, with rank 0's parameters on every
// rank (whatever each rank's own initialization did).
struct TrainingStart {
  TrainingData data;
  std::unique_ptr<data::GlobalSampler> sampler;
  std::shared_ptr<model::ZooModel> model;
};
TrainingStart startTraining(JobConfig& job, Worker& worker);

// The optimizer of the job over `parameters`, and its learning rate at `step`.
std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const OptimizerSection& options,
                                                       std::vector<at::Tensor> parameters);
double learningRateAt(const OptimizerSection& options, std::int64_t step, std::int64_t steps);
void setLearningRate(torch::optim::Optimizer& optimizer, double lr);

// Largest micro-batch of a data-parallel rank computing in `dtype` that fits `budget_bytes` by the
// job's memory model (memory_calibration.h). Throws ConfigError naming `device` when not even one
// sample fits.
std::int64_t maxMicroBatch(const plan::MemoryModel& memory, plan::Dtype dtype,
                           std::uint64_t budget_bytes, const std::string& device);

// Deep copies of the model's tensors and of the optimizer (over copied parameters), taken between
// steps so that they can be serialized while training goes on.
struct StateCopy {
  std::vector<std::pair<std::string, at::Tensor>> model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
};
StateCopy copyState(Trainer::State& s);

// A checkpoint of `s` as it is after its last completed step, independent of later training:
// the small files already serialized, the model and optimizer as deep copies that serialize()
// turns into files (on any thread). Rank 0 holds the shared state (model, optimizer,
// trainer.json), every rank its own (RNG, loss scaler, codec memory). Copyable (shares the copies).
struct CheckpointSnapshot {
  std::vector<CheckpointFile> small;
  std::function<std::vector<CheckpointFile>()> serialize;  // null: nothing heavy on this rank
  std::vector<CheckpointFile> files() const {
    std::vector<CheckpointFile> all = small;
    if (serialize)
      for (auto& file : serialize()) all.push_back(std::move(file));
    return all;
  }
};
CheckpointSnapshot snapshotCheckpoint(Trainer::State& s);
// Restores `s` from a verified checkpoint directory. Throws CheckpointError.
void restoreCheckpoint(Trainer::State& s, const std::string& dir);
// Writes a checkpoint when one is due after the step just completed: every checkpoint.every
// steps (in the background in async mode), or now when `final_or_requested`. Never twice for one
// step. No-op without checkpoint.dir. Returns whether it wrote (or started writing) one.
bool writeCheckpointIfDue(Trainer::State& s, bool final_or_requested);
// Waits for a background write in flight, if any; rethrows its error.
void finishPendingCheckpoint(Trainer::State& s);

struct Trainer::State {
  JobConfig job;
  std::shared_ptr<Worker> worker;
  TrainingData data;
  std::unique_ptr<data::GlobalSampler> sampler;
  std::shared_ptr<model::ZooModel> model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<parallel::GradientReducer> reducer;
  std::unique_ptr<plan::LoadBalancer> balancer;
  // The plan's shares when balancer.shares fixes them (the balancer then does not run); else empty.
  std::vector<std::int64_t> fixed_shares;
  device::SpeedEmulator* emulator = nullptr;  // the worker's, or speed_override's
  // The compute phase in progress (runShare), in which the reducer holds each gradient bucket
  // back (reducerOptions) when this rank emulates a slower device; null between phases.
  device::SpeedEmulator::ComputeScope* phase = nullptr;
  // For each bucket held back in the phase, in launch order: the phase's compute when the
  // bucket's gradients were final (ComputeScope::computeSoFar), where its launch belongs.
  std::vector<double> held_at;
  // The timeline this step is recorded on (TrainerHooks::trace while it records), or null.
  observe::TraceRecorder* trace = nullptr;
  std::unique_ptr<device::SpeedEmulator> speed_override;  // set by TrainerHooks::speed_at
  double speed = 1.0;
  std::int64_t micro_limit = 0;  // max samples per micro-batch on this rank (0: none)
  std::int64_t next_step = 0;
  // Mixed precision: the rank's compute format; fp16 ranks scale their loss.
  parallel::Precision precision = parallel::Precision::kFp32;
  std::optional<parallel::DynamicLossScaler> scaler;
  std::unique_ptr<parallel::GradientUnscaler> unscaler;
  std::int64_t skipped_steps = 0;
  // Gradient compression (null: none); its memory (residuals, PowerSGD's Q) is checkpointed.
  std::shared_ptr<parallel::GradientCodec> codec;
  // Local SGD (comm.sync_every > 1): samples this rank took since the last parameter average.
  std::int64_t samples_since_average = 0;
  // Checkpoints: the writer (null without checkpoint.dir), the write in flight (async mode) and
  // the step of the newest checkpoint written or resumed from.
  std::unique_ptr<CheckpointWriter> checkpoints;
  std::future<std::string> pending_checkpoint;
  std::int64_t last_checkpoint_step = -1;
  std::string last_checkpoint_path;
};

}  // namespace chorus::runtime
