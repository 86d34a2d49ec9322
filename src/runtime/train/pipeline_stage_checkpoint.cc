// The pipeline engine's part of a checkpoint: each rank writes its stage's parameters, optimizer
// state, RNG, loss scale (fp16) and codec memory under its (stage, replica) name; trainer.json
// holds the layout and the replicas' balancer (with their shares). Resume on the same stages and
// replicas is bitwise; on another layout (a data-parallel checkpoint too) every rank reads its
// layers from the files that hold them (layer_state_restore.h), and the shares are planned anew.
#include <ATen/ATen.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/checkpoint_archive.h"
#include "chorus/core/error.h"
#include "chorus/core/logging.h"
#include "train/engine_settings.h"
#include "train/layer_state_restore.h"
#include "train/pipeline_stage_engine.h"

namespace chorus::runtime {
namespace {

// "stage-1-replica-0-model.pt". Built with a stream: GCC 12 warns falsely on long `+` chains.
std::string stageFile(const PipelineStageEngine& s, const char* what) {
  std::ostringstream name;
  name << "stage-" << s.position().stage << "-replica-" << s.position().replica << '-' << what
       << ".pt";
  return name.str();
}

nlohmann::json layoutJson(const PipelineStageEngine& s) {
  return {{"stages", s.options.pipeline_stages},
          {"replicas", s.options.replicas},
          {"cuts", s.stage_cuts},
          {"replica_shares", s.options.replica_shares}};
}

// A checkpoint written after the cut moved (parallel.recut) holds each stage's layers of that
// cut: every rank rebuilds on it before reading its files (the same stages and replicas only).
void adoptCut(PipelineStageEngine& s, const CheckpointSource& source) {
  if (!source.saved.contains("pipeline")) return;
  const nlohmann::json& saved = source.saved.at("pipeline");
  const nlohmann::json now = layoutJson(s);
  if (saved.at("stages") != now.at("stages") || saved.at("replicas") != now.at("replicas") ||
      saved.at("cuts") == now.at("cuts"))
    return;
  s.recut->adopt(saved.at("cuts").get<std::vector<int>>(),
                 source.saved.at("step").get<std::int64_t>());
}

// Whether the checkpoint was written by this many stages and replicas (its cut adopted already):
// then each rank's files are its own, and the resume is bitwise.
bool sameLayout(const PipelineStageEngine& s, const CheckpointSource& source) {
  if (!source.saved.contains("pipeline")) return false;
  const nlohmann::json& saved = source.saved.at("pipeline");
  const nlohmann::json now = layoutJson(s);
  for (const char* key : {"stages", "replicas", "cuts"})
    if (saved.at(key) != now.at(key)) return false;
  return true;
}

// Another layout: this stage's layers come from the files that hold them, with the RNG of the
// rank that trained the first of them. The loss scale and a codec's memory start afresh (they
// were another rank's), and the shares stay the plan's.
void restoreOtherLayout(PipelineStageEngine& s, const CheckpointSource& source) {
  s.skipped_steps = restoreLayersAndGenerator(source, *s.model, s.engine->firstLayer(),
                                              s.engine->lastLayer(), *s.optimizer, s.job.optimizer);
  if (s.worker->rank() == 0)
    logInfo("resuming a checkpoint of ", describeSavedLayout(source), " on ",
            s.options.pipeline_stages, " stages x ", s.options.replicas,
            " replicas: each stage reads its layers; the shares are planned anew");
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> stageTensors(PipelineStageEngine& s) {
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

nlohmann::json PipelineStageEngine::checkpointEntries() const {
  return {{"pipeline", layoutJson(*this)},
          {"balancer", balancer->toJson()},
          {"skipped_steps", skipped_steps}};
}

// Serialized now, between steps (the stage's share of the model is small); only the disk work
// goes to the background in async mode.
CheckpointSnapshot PipelineStageEngine::snapshot() {
  PipelineStageEngine& s = *this;
  CheckpointSnapshot snapshot;
  torch::serialize::OutputArchive model_archive, optimizer_archive, rng;
  for (const auto& [name, tensor] : stageTensors(s)) model_archive.write(name, tensor.detach());
  s.optimizer->save(optimizer_archive);
  rng.write("rng_cpu", generatorState(cpuGenerator()));
  if (s.scaler) writeScalerState(rng, *s.scaler);
  if (s.codec) writeCodecState(rng, *s.codec);
  snapshot.small.push_back({stageFile(s, "model"), archiveBytes(model_archive)});
  snapshot.small.push_back({stageFile(s, "optimizer"), archiveBytes(optimizer_archive)});
  snapshot.small.push_back({stageFile(s, "rng"), archiveBytes(rng)});
  return snapshot;
}

void PipelineStageEngine::restore(const CheckpointSource& source) {
  PipelineStageEngine& s = *this;
  adoptCut(s, source);
  if (!sameLayout(s, source)) return restoreOtherLayout(s, source);
  torch::NoGradGuard no_grad;
  auto model_archive = archiveOf(source.read(stageFile(s, "model")));
  for (auto& [name, tensor] : stageTensors(s))
    readInto(model_archive, name, tensor, !tensor.requires_grad());
  auto optimizer_archive = archiveOf(source.read(stageFile(s, "optimizer")));
  s.optimizer->load(optimizer_archive);
  moveStatesToParameters(*s.optimizer);
  auto rng = archiveOf(source.read(stageFile(s, "rng")));
  at::Tensor cpu_rng;
  rng.read("rng_cpu", cpu_rng);
  setGeneratorState(cpuGenerator(), cpu_rng);
  if (s.scaler) readScalerState(rng, *s.scaler);
  if (s.codec) readCodecState(rng, *s.codec);
  s.skipped_steps = source.saved.value("skipped_steps", std::int64_t{0});
  // The shares the next step runs with, and what the balancer measured: without them a resumed
  // run would split the batches differently and no longer be bitwise the run that wrote it.
  // Checkpoints from before the balancer carry none and keep the start plan.
  if (source.saved.contains("balancer")) {
    s.balancer->restore(source.saved.at("balancer"));
    s.options.replica_shares = s.balancer->shares();
    s.engine->setReplicaShares(s.options.replica_shares);
  }
}

}  // namespace chorus::runtime
