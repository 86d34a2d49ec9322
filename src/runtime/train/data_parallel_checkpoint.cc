// The data-parallel engine's part of a checkpoint: the model and optimizer (rank 0; every rank its
// own under local SGD; under ZeRO every rank its optimizer slice, and under ZeRO-3 its parameter
// slice instead of rank 0's model), every rank's RNG, loss scaler and codec memory, the balancer's
// state in trainer.json. A checkpoint of another world size resumes with new shares; a pipeline's
// is read layer by layer (layer_state_restore.h).
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/checkpoint_archive.h"
#include "chorus/core/error.h"
#include "chorus/core/logging.h"
#include "job/balancer_settings.h"
#include "train/data_parallel_engine.h"
#include "train/engine_settings.h"
#include "train/layer_state_restore.h"

namespace chorus::runtime {
namespace {

constexpr const char* kModelFile = "model.pt";
constexpr const char* kOptimizerFile = "optimizer.pt";

// The generator of `device` (CUDA), when it has one of its own.
std::optional<at::Generator> deviceGenerator(const c10::Device& device) {
  if (device.is_cpu()) return std::nullopt;
  return at::globalContext().defaultGenerator(device);
}

// The model archive is flat: one tensor per dotted parameter or buffer name, copied in place
// (the file may come from a rank on another device).
void loadModel(model::ZooModel& model, torch::serialize::InputArchive& archive) {
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) readInto(archive, item.key(), item.value(), false);
  for (auto& item : model.named_buffers()) readInto(archive, item.key(), item.value(), true);
}

// Deep copy of one optimizer state entry (SGD and AdamW, the trainer's optimizers).
std::unique_ptr<torch::optim::OptimizerParamState> deepCopy(
    torch::optim::OptimizerParamState& state) {
  if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(&state)) {
    auto copy = std::make_unique<torch::optim::SGDParamState>();
    if (sgd->momentum_buffer().defined()) copy->momentum_buffer(sgd->momentum_buffer().clone());
    return copy;
  }
  if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(&state)) {
    auto copy = std::make_unique<torch::optim::AdamWParamState>();
    copy->step(adamw->step());
    copy->exp_avg(adamw->exp_avg().clone());
    copy->exp_avg_sq(adamw->exp_avg_sq().clone());
    if (adamw->max_exp_avg_sq().defined()) copy->max_exp_avg_sq(adamw->max_exp_avg_sq().clone());
    return copy;
  }
  CHORUS_THROW(CheckpointError, "cannot snapshot this optimizer's state (SGD and AdamW only)");
}

// Deep copies of the model's tensors and of the optimizer (over copied parameters), taken between
// steps so that they can be serialized while training goes on.
struct StateCopy {
  std::vector<std::pair<std::string, at::Tensor>> model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
};

// `optimizer`: the replicated one of `section`'s kind; null under ZeRO.
StateCopy copyState(const model::ZooModel& model, const torch::optim::Optimizer* optimizer,
                    const OptimizerSection& section) {
  torch::NoGradGuard no_grad;
  StateCopy copy;
  for (const auto& item : model.named_parameters())
    copy.model.emplace_back(item.key(), item.value().detach().clone());
  for (const auto& item : model.named_buffers())
    copy.model.emplace_back(item.key(), item.value().detach().clone());
  // Under ZeRO every rank saves its own optimizer slice (writeZeroSlice).
  if (optimizer == nullptr) return copy;
  std::vector<at::Tensor> parameters;
  for (const auto& parameter : optimizer->param_groups().at(0).params())
    parameters.push_back(parameter.detach().clone());
  copy.optimizer = makeOptimizer(section, parameters);
  copy.optimizer->param_groups().at(0).set_options(
      optimizer->param_groups().at(0).options().clone());
  const auto& original = optimizer->param_groups().at(0).params();
  for (size_t i = 0; i < original.size(); ++i) {
    auto found = optimizer->state().find(original[i].unsafeGetTensorImpl());
    if (found != optimizer->state().end())
      copy.optimizer->state()[parameters[i].unsafeGetTensorImpl()] = deepCopy(*found->second);
  }
  return copy;
}

}  // namespace

void DataParallelEngine::restoreRankState(const std::string& bytes) {
  auto archive = archiveOf(bytes);
  at::Tensor cpu_rng, device_rng;
  archive.read("rng_cpu", cpu_rng);
  setGeneratorState(cpuGenerator(), cpu_rng);
  if (auto generator = deviceGenerator(worker_->device());
      generator && archive.try_read("rng_device", device_rng))
    setGeneratorState(*generator, device_rng);
  if (codec_) readCodecState(archive, *codec_);
  at::Tensor since;
  if (archive.try_read("samples_since_average", since))
    samples_since_average_ = static_cast<std::int64_t>(since.item<double>());
  if (scaler_) readScalerState(archive, *scaler_);
}

// A pipeline's checkpoint: the whole model from its stages' files, the RNG of the rank that
// trained the first layer; the loss scale and a codec's memory start afresh, and the shares are
// the plan's. Every rank holds its whole optimizer state, so neither ZeRO nor local SGD's own
// models can take it.
void DataParallelEngine::restorePipelineCheckpoint(const CheckpointSource& source) {
  if (zero_ || comm_.sync_period > 1)
    source.mismatch("the layout", describeSavedLayout(source),
                    zero_ ? "ZeRO (a pipeline checkpoint resumes without it)"
                          : "local SGD (a pipeline checkpoint resumes with comm.sync_every = 1)");
  skipped_steps_ = restoreLayersAndGenerator(
      source, *model_, 0, static_cast<int>(model_->numLayers()), *optimizer_, job_.optimizer);
  if (worker_->rank() == 0)
    logInfo("resuming a checkpoint of ", describeSavedLayout(source), " on one stage per replica (",
            worker_->worldSize(), " ranks): the shares are planned anew");
}

CheckpointSnapshot DataParallelEngine::snapshot() {
  requireGatheredParameters();
  CheckpointSnapshot snapshot;
  std::vector<CheckpointFile>& files = snapshot.small;
  torch::serialize::OutputArchive mine;
  mine.write("rng_cpu", generatorState(cpuGenerator()));
  if (auto generator = deviceGenerator(worker_->device()))
    mine.write("rng_device", generatorState(*generator));
  if (scaler_) writeScalerState(mine, *scaler_);
  if (codec_) writeCodecState(mine, *codec_);
  if (zero_) writeZeroSlice(mine);
  mine.write("samples_since_average",
             at::tensor({static_cast<double>(samples_since_average_)}, at::kDouble));
  files.push_back({rankFile(worker_->rank()), archiveBytes(mine)});
  // ZeRO-3: the rank file holds this rank's slice of the parameters; no rank has the whole model
  // (`chorus checkpoint consolidate` writes one).
  if (zero_layers_) return snapshot;
  // Model and optimizer: deep copies now (memory bandwidth), serialized later — in the
  // background in async mode. Replicas are identical except under local SGD.
  const bool own = comm_.sync_period > 1;
  if (worker_->rank() != 0 && !own) return snapshot;
  auto copy = std::make_shared<StateCopy>(copyState(*model_, optimizer_.get(), job_.optimizer));
  // Names built with a stream: GCC 12 warns falsely on `"x" + string` here (stringop-overflow).
  std::ostringstream suffix_text;
  if (own) suffix_text << '-' << rankFile(worker_->rank());
  const std::string suffix = suffix_text.str();
  const bool shared = worker_->rank() == 0;
  snapshot.serialize = [copy, suffix, shared] {
    std::vector<CheckpointFile> heavy;
    torch::serialize::OutputArchive model, optimizer;
    for (const auto& [name, tensor] : copy->model) model.write(name, tensor);
    if (copy->optimizer) copy->optimizer->save(optimizer);
    const std::string model_bytes = archiveBytes(model), optimizer_bytes = archiveBytes(optimizer);
    if (shared) {
      heavy.push_back({kModelFile, model_bytes});
      if (copy->optimizer) heavy.push_back({kOptimizerFile, optimizer_bytes});
    }
    if (!suffix.empty()) {
      heavy.push_back({std::string("model").append(suffix), model_bytes});
      heavy.push_back({std::string("optimizer").append(suffix), optimizer_bytes});
    }
    return heavy;
  };
  return snapshot;
}

nlohmann::json DataParallelEngine::checkpointEntries() const {
  nlohmann::json entries = {{"balancer", balancerStateToJson(balancer_->exportState())},
                            {"skipped_steps", skipped_steps_}};
  if (zero_) entries["zero"] = zeroEntry();
  return entries;
}

void DataParallelEngine::restore(const CheckpointSource& source) {
  if (source.saved.contains("pipeline")) return restorePipelineCheckpoint(source);
  // A ZeRO-3 checkpoint has no model file (its parameters are in the rank files), and a ZeRO-3
  // engine's parameters hold no values: restoreOptimizer takes care of both.
  if (source.has(kModelFile) && !zero_layers_) {
    auto model_archive = archiveOf(source.read(kModelFile));
    loadModel(*model_, model_archive);
  }
  restoreOptimizer(source);
  skipped_steps_ = source.saved.value("skipped_steps", std::int64_t{0});
  const int world = worker_->worldSize();
  if (source.manifest.world_size == world) {
    balancer_->importState(balancerStateFromJson(source.saved.at("balancer")));
    restoreRankState(source.read(rankFile(worker_->rank())));
    const std::string own_model = "model-" + rankFile(worker_->rank());
    if (comm_.sync_period > 1 && source.has(own_model)) {
      auto own = archiveOf(source.read(own_model));
      loadModel(*model_, own);
      auto own_optimizer = archiveOf(source.read("optimizer-" + rankFile(worker_->rank())));
      optimizer_->load(own_optimizer);
      moveStatesToParameters(*optimizer_);
    }
  } else if (worker_->rank() == 0) {
    logInfo("resuming a ", source.manifest.world_size, "-rank checkpoint on ", world,
            " ranks: the batch sequence goes on, shares are planned anew");
  }
}

}  // namespace chorus::runtime
