// The PipelineTrainer's checkpoints: each rank writes its stage's parameters, optimizer state and
// RNG under its (stage, replica) name, rank 0 adds trainer.json (with the replica shares and the
// load balancer's state); resume needs the same layout.
#include <ATen/ATen.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint_archive.h"
#include "chorus/core/error.h"
#include "chorus/core/logging.h"
#include "pipeline_trainer_state.h"

namespace chorus::runtime {
namespace {

constexpr const char* kTrainerFile = "trainer.json";

// "stage-1-replica-0-model.pt". Built with a stream: GCC 12 warns falsely on long `+` chains.
std::string stageFile(const PipelineTrainer::State& s, const char* what) {
  std::ostringstream name;
  name << "stage-" << s.position().stage << "-replica-" << s.position().replica << '-' << what
       << ".pt";
  return name.str();
}

nlohmann::json trainerJson(const PipelineTrainer::State& s) {
  return {{"step", s.next_step},
          {"world_size", s.worker->worldSize()},
          {"seed", s.job.seed},
          {"global_batch", s.job.train.global_batch},
          {"model", s.model->describe()},
          {"pipeline",
           {{"stages", s.options.pipeline_stages},
            {"replicas", s.options.replicas},
            {"cuts", s.cuts},
            {"replica_shares", s.options.replica_shares}}},
          {"sampler", samplerJson(*s.sampler, s.next_step)},
          {"balancer", s.balancer->toJson()},
          {"config", s.job.toml}};
}

// The checkpoint must come from the same training problem and the same layout.
void checkCompatible(const PipelineTrainer::State& s, const nlohmann::json& saved,
                     const std::string& dir) {
  auto mismatch = [&](const char* what, const std::string& then, const std::string& now) {
    CHORUS_THROW(CheckpointError, "checkpoint '", dir, "' does not fit this job: ", what, " was ",
                 then, ", now ", now);
  };
  if (!saved.contains("pipeline"))
    CHORUS_THROW(CheckpointError, "checkpoint '", dir,
                 "' was written by the data-parallel trainer (parallel.pipeline_stages = 1)");
  if (saved.at("seed").get<std::uint64_t>() != s.job.seed)
    mismatch("seed", saved.at("seed").dump(), std::to_string(s.job.seed));
  if (saved.at("global_batch").get<std::int64_t>() != s.job.train.global_batch)
    mismatch("train.global_batch", saved.at("global_batch").dump(),
             std::to_string(s.job.train.global_batch));
  if (saved.at("model").get<std::string>() != s.model->describe())
    mismatch("the model", saved.at("model").get<std::string>(), s.model->describe());
  const nlohmann::json& layout = saved.at("pipeline");
  const nlohmann::json now = {
      {"stages", s.options.pipeline_stages}, {"replicas", s.options.replicas}, {"cuts", s.cuts}};
  for (const char* key : {"stages", "replicas", "cuts"})
    if (layout.at(key) != now.at(key))
      mismatch(key, layout.at(key).dump(),
               now.at(key).dump() + " (resume needs the pipeline layout that wrote it)");
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> stageTensors(PipelineTrainer::State& s) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  const auto layers = s.model->named_children();
  for (int l = s.engine->firstLayer(); l < s.engine->lastLayer(); ++l) {
    const auto& layer = layers[l];
    for (const auto& item : layer.value()->named_parameters(/*recurse=*/true))
      tensors.emplace_back(layer.key() + "." + item.key(), item.value());
    for (const auto& item : layer.value()->named_buffers(/*recurse=*/true))
      tensors.emplace_back(layer.key() + "." + item.key(), item.value());
  }
  return tensors;
}

std::vector<CheckpointFile> pipelineCheckpointFiles(PipelineTrainer::State& s) {
  std::vector<CheckpointFile> files;
  if (s.worker->rank() == 0) files.push_back({kTrainerFile, trainerJson(s).dump(1) + "\n"});
  torch::serialize::OutputArchive model, optimizer, rng;
  for (const auto& [name, tensor] : stageTensors(s)) model.write(name, tensor.detach());
  s.optimizer->save(optimizer);
  rng.write("rng_cpu", generatorState(cpuGenerator()));
  files.push_back({stageFile(s, "model"), archiveBytes(model)});
  files.push_back({stageFile(s, "optimizer"), archiveBytes(optimizer)});
  files.push_back({stageFile(s, "rng"), archiveBytes(rng)});
  return files;
}

void restorePipelineCheckpoint(PipelineTrainer::State& s, const std::string& dir) {
  translateRestoreErrors(dir, [&] {
    const Manifest manifest = readManifest(dir);
    const nlohmann::json saved =
        nlohmann::json::parse(readCheckpointFile(dir, manifest, kTrainerFile));
    checkCompatible(s, saved, dir);
    torch::NoGradGuard no_grad;
    auto model = archiveOf(readCheckpointFile(dir, manifest, stageFile(s, "model")));
    for (auto& [name, tensor] : stageTensors(s)) model.read(name, tensor, !tensor.requires_grad());
    auto optimizer = archiveOf(readCheckpointFile(dir, manifest, stageFile(s, "optimizer")));
    s.optimizer->load(optimizer);
    auto rng = archiveOf(readCheckpointFile(dir, manifest, stageFile(s, "rng")));
    at::Tensor cpu_rng;
    rng.read("rng_cpu", cpu_rng);
    setGeneratorState(cpuGenerator(), cpu_rng);
    // The shares the next step runs with, and what the balancer measured: without them a resumed
    // run would split the batches differently and no longer be bitwise the run that wrote it.
    // Checkpoints from before the balancer carry none and keep the start plan.
    if (saved.contains("balancer")) {
      s.balancer->restore(saved.at("balancer"));
      s.options.replica_shares = s.balancer->shares();
      s.engine->setReplicaShares(s.options.replica_shares);
    }
    s.next_step = resumeSampler(*s.sampler, saved.at("sampler"));
    s.last_checkpoint_step = s.next_step;
  });
}

void writePipelineCheckpointIfDue(PipelineTrainer::State& s, bool final_or_requested) {
  if (!s.checkpoints || s.last_checkpoint_step == s.next_step) return;
  const std::int64_t every = s.job.checkpoint.every;
  if (!final_or_requested && !(every > 0 && s.next_step % every == 0)) return;
  if (s.pending_checkpoint.valid()) s.last_checkpoint_path = s.pending_checkpoint.get();
  s.last_checkpoint_step = s.next_step;
  // Serialized now, between steps (the stage's share of the model is small); only the disk
  // work goes to the background in async mode.
  std::vector<CheckpointFile> files = pipelineCheckpointFiles(s);
  const std::int64_t step = s.next_step;
  if (s.job.checkpoint.async && !final_or_requested) {
    CheckpointWriter* writer = s.checkpoints.get();
    s.pending_checkpoint = std::async(std::launch::async,
                                      [writer, step, files] { return writer->write(step, files); });
    return;
  }
  s.last_checkpoint_path = s.checkpoints->write(step, files);
}

std::string PipelineTrainer::checkpoint() {
  State& s = *state_;
  if (!s.checkpoints)
    CHORUS_THROW(ConfigError, "no checkpoint directory: set checkpoint.dir to write checkpoints");
  if (s.pending_checkpoint.valid()) s.pending_checkpoint.get();  // one write in flight at a time
  s.last_checkpoint_step = s.next_step;
  s.last_checkpoint_path = s.checkpoints->write(s.next_step, pipelineCheckpointFiles(s));
  return s.last_checkpoint_path;
}

void PipelineTrainer::resume(const std::string& checkpoint_dir) {
  restorePipelineCheckpoint(*state_, checkpoint_dir);
  if (state_->worker->rank() == 0)
    logInfo("resumed from ", checkpoint_dir, " at step ", state_->next_step);
}

}  // namespace chorus::runtime
