// A checkpoint read layer by layer (layer_state_restore.h). The optimizer files are libtorch's
// archives of an optimizer over the writer's parameter list, matched by position: each is loaded
// into a scratch optimizer over stand-ins of that list, and the state of the layers asked for
// moves from the stand-ins to the real parameters.
#include "train/layer_state_restore.h"

#include <ATen/ATen.h>
#include <torch/torch.h>

#include <map>
#include <sstream>

#include "checkpoint/checkpoint_archive.h"
#include "chorus/core/error.h"
#include "train/trainer_state.h"

namespace chorus::runtime {
namespace {

constexpr const char* kModelFile = "model.pt";
constexpr const char* kOptimizerFile = "optimizer.pt";

std::string stageFileName(int stage, const char* what) {
  std::ostringstream name;
  name << "stage-" << stage << "-replica-0-" << what << ".pt";
  return name.str();
}

// The parameters the engine that wrote `files` optimized, in its optimizer's order.
std::vector<at::Tensor> writerParameters(model::ZooModel& model, const LayerFiles& files) {
  if (files.whole_model) return model.parameters();
  std::vector<at::Tensor> parameters;
  for (int l = files.first; l < files.last; ++l)
    for (const at::Tensor& parameter : model.layerParameters(l))
      if (parameter.requires_grad()) parameters.push_back(parameter);
  return parameters;
}

// The values of layers [first, last) of `model` from `archive` (named as in the whole model).
void readLayerValues(model::ZooModel& model, torch::serialize::InputArchive& archive, int first,
                     int last) {
  const auto layers = model.named_children();
  for (int l = first; l < last; ++l) {
    const auto& layer = layers[l];
    for (const auto& item : layer.value()->named_parameters(/*recurse=*/true))
      readInto(archive, layer.key() + "." + item.key(), item.value(), false);
    for (const auto& item : layer.value()->named_buffers(/*recurse=*/true))
      readInto(archive, layer.key() + "." + item.key(), item.value(), true);
  }
}

using States = std::map<const void*, std::unique_ptr<torch::optim::OptimizerParamState>>;

// The optimizer state `files` holds for the parameters of `wanted`, by the real parameter's key.
void readLayerStates(const CheckpointSource& source, model::ZooModel& model,
                     const LayerFiles& files, const std::vector<at::Tensor>& wanted,
                     const OptimizerSection& options, States& states) {
  if (!source.has(files.optimizer)) return;  // written before the first step had any
  const std::vector<at::Tensor> writer = writerParameters(model, files);
  std::vector<at::Tensor> stand_ins;
  for (const at::Tensor& parameter : writer)
    stand_ins.push_back(at::zeros(parameter.sizes(), parameter.options().requires_grad(false)));
  auto scratch = makeOptimizer(options, stand_ins);
  auto archive = archiveOf(source.read(files.optimizer));
  scratch->load(archive);
  std::map<const void*, std::size_t> wanted_index;
  for (std::size_t i = 0; i < wanted.size(); ++i) wanted_index[wanted[i].unsafeGetTensorImpl()] = i;
  for (std::size_t i = 0; i < writer.size(); ++i) {
    const void* key = writer[i].unsafeGetTensorImpl();
    if (wanted_index.count(key) == 0) continue;
    auto found = scratch->state().find(stand_ins[i].unsafeGetTensorImpl());
    if (found == scratch->state().end()) continue;
    states[key] = std::move(found->second);
  }
}

// `state`'s tensors on `device`.
void moveState(torch::optim::OptimizerParamState& state, const at::Device& device) {
  if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(&state)) {
    if (sgd->momentum_buffer().defined()) sgd->momentum_buffer(sgd->momentum_buffer().to(device));
  } else if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(&state)) {
    adamw->exp_avg(adamw->exp_avg().to(device));
    adamw->exp_avg_sq(adamw->exp_avg_sq().to(device));
    if (adamw->max_exp_avg_sq().defined())
      adamw->max_exp_avg_sq(adamw->max_exp_avg_sq().to(device));
  }
}

}  // namespace

void readInto(torch::serialize::InputArchive& archive, const std::string& name, at::Tensor target,
              bool is_buffer) {
  at::Tensor value;
  archive.read(name, value, is_buffer);
  target.detach().copy_(value);
}

void moveStatesToParameters(torch::optim::Optimizer& optimizer) {
  auto& states = optimizer.state();
  for (const auto& group : optimizer.param_groups())
    for (const at::Tensor& parameter : group.params())
      if (auto found = states.find(parameter.unsafeGetTensorImpl()); found != states.end())
        moveState(*found->second, parameter.device());
}

std::vector<LayerFiles> layerFilesOf(const CheckpointSource& source, int layers) {
  const nlohmann::json& saved = source.saved;
  std::vector<LayerFiles> files;
  if (saved.contains("pipeline")) {
    const auto cuts = saved.at("pipeline").at("cuts").get<std::vector<int>>();
    if (cuts.size() < 2 || cuts.front() != 0 || cuts.back() != layers)
      source.mismatch("the pipeline's cut", saved.at("pipeline").at("cuts").dump(),
                      "a model of " + std::to_string(layers) + " layers");
    for (std::size_t s = 0; s + 1 < cuts.size(); ++s) {
      const int stage = static_cast<int>(s);
      files.push_back({cuts[s], cuts[s + 1], stageFileName(stage, "model"),
                       stageFileName(stage, "optimizer"), stageFileName(stage, "rng"), false});
    }
    return files;
  }
  if (saved.contains("zero"))
    source.mismatch("the layout",
                    "ZeRO stage " + std::to_string(saved.at("zero").value("stage", 0)),
                    "a layout that keeps each layer whole (a ZeRO checkpoint resumes on one stage "
                    "per replica)");
  // Under local SGD rank 0's model.pt is its own, not averaged: each rank keeps one.
  if (!source.has(kModelFile) || source.has("model-" + rankFile(0)))
    source.mismatch("the layout", "a model kept by each rank (local SGD)",
                    "one model for every rank");
  files.push_back({0, layers, kModelFile, kOptimizerFile, rankFile(0), true});
  return files;
}

std::string restoreLayers(const CheckpointSource& source, model::ZooModel& model, int first,
                          int last, torch::optim::Optimizer& optimizer,
                          const OptimizerSection& options) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> wanted;
  for (const auto& group : optimizer.param_groups())
    for (const at::Tensor& parameter : group.params()) wanted.push_back(parameter);
  std::string rank_state;
  States states;
  for (const LayerFiles& files : layerFilesOf(source, static_cast<int>(model.numLayers()))) {
    const int from = std::max(first, files.first), to = std::min(last, files.last);
    if (from >= to) continue;
    if (rank_state.empty()) rank_state = files.rank_state;
    auto values = archiveOf(source.read(files.model));
    readLayerValues(model, values, from, to);
    readLayerStates(source, model, files, wanted, options, states);
  }
  auto& live = optimizer.state();
  for (const at::Tensor& parameter : wanted) {
    void* key = parameter.unsafeGetTensorImpl();
    live.erase(key);
    if (auto found = states.find(key); found != states.end()) live[key] = std::move(found->second);
  }
  moveStatesToParameters(optimizer);
  return rank_state;
}

std::int64_t restoreLayersAndGenerator(const CheckpointSource& source, model::ZooModel& model,
                                       int first, int last, torch::optim::Optimizer& optimizer,
                                       const OptimizerSection& options) {
  const std::string rank_state = restoreLayers(source, model, first, last, optimizer, options);
  auto archive = archiveOf(source.read(rank_state));
  at::Tensor cpu_rng;
  archive.read("rng_cpu", cpu_rng);
  setGeneratorState(cpuGenerator(), cpu_rng);
  return source.saved.value("skipped_steps", std::int64_t{0});
}

std::string describeSavedLayout(const CheckpointSource& source) {
  std::ostringstream text;
  if (!source.saved.contains("pipeline")) {
    text << "one stage per replica on " << source.manifest.world_size << " ranks";
    return text.str();
  }
  const nlohmann::json& pipeline = source.saved.at("pipeline");
  const auto cuts = pipeline.at("cuts").get<std::vector<int>>();
  text << pipeline.at("stages").get<int>() << " stages x " << pipeline.at("replicas").get<int>()
       << " replicas, cut ";
  for (std::size_t s = 0; s + 1 < cuts.size(); ++s) text << (s ? "+" : "") << cuts[s + 1] - cuts[s];
  return text.str();
}

}  // namespace chorus::runtime
