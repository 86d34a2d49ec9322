// Private to runtime: what one rank's PipelineTrainer holds, and the helpers its files share.
#pragma once

#include <torch/optim.h>

#include <future>
#include <memory>
#include <string>
#include <vector>

#include "chorus/data/sampler.h"
#include "chorus/model/zoo_model.h"
#include "chorus/parallel/pipeline.h"
#include "chorus/runtime/checkpoint.h"
#include "chorus/runtime/pipeline_trainer.h"
#include "pipeline_balancing.h"
#include "trainer_state.h"

namespace chorus::runtime {

struct PipelineTrainer::State {
  JobConfig job;
  std::shared_ptr<Worker> worker;
  TrainingData data;
  std::unique_ptr<data::GlobalSampler> sampler;
  std::shared_ptr<model::ZooModel> model;
  // replica_shares: the shares the next step runs with (the balancer's, kept in step with it).
  parallel::PipelineOptions options;
  std::vector<int> cuts;
  std::unique_ptr<ReplicaBalancer> balancer;
  // The emulated speed (TrainerHooks::speed_at) and the emulator that pads to it when the hook
  // overrides the device's speed; the engine pads with the worker's emulator otherwise.
  double speed = 1.0;
  std::unique_ptr<device::SpeedEmulator> speed_override;
  std::unique_ptr<parallel::PipelineEngine> engine;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::int64_t next_step = 0;
  // Samples per evaluation chunk: 256, or a training micro-batch under a memory budget.
  std::int64_t eval_chunk = 256;
  // Checkpoints: the writer (null without checkpoint.dir), the write in flight (async mode) and
  // the step of the newest checkpoint written or resumed from.
  std::unique_ptr<CheckpointWriter> checkpoints;
  std::future<std::string> pending_checkpoint;
  std::int64_t last_checkpoint_step = -1;
  std::string last_checkpoint_path;

  parallel::StagePosition position() const { return engine->position(); }
  int stages() const { return options.pipeline_stages; }
  bool firstStage() const { return position().stage == 0; }
  bool lastStage() const { return position().stage + 1 == stages(); }
};

// The (name, tensor) pairs of the stage's layers: parameters and buffers, named as in the whole
// model ("block2.attention.weight"), so checkpoints are readable and checkable by name.
std::vector<std::pair<std::string, at::Tensor>> stageTensors(PipelineTrainer::State& s);

// The files of a checkpoint of `s` after its last completed step, serialized now.
std::vector<CheckpointFile> pipelineCheckpointFiles(PipelineTrainer::State& s);
// Restores `s` from a verified checkpoint directory of the same layout. Throws CheckpointError.
void restorePipelineCheckpoint(PipelineTrainer::State& s, const std::string& dir);
// Writes a checkpoint when one is due after the step just completed (every checkpoint.every
// steps, in the background in async mode; now when `final_or_requested`). Never twice for one
// step; no-op without checkpoint.dir.
void writePipelineCheckpointIfDue(PipelineTrainer::State& s, bool final_or_requested);

}  // namespace chorus::runtime
