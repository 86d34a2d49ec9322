// ZeRO's part of a data-parallel checkpoint. Each rank writes the optimizer state of its own
// slice ("zero/<name>" in rank-<r>.pt) and rank 0 the whole model (ZeRO-3: each rank its slice of
// the parameters, "zero/parameters", and no rank the model); trainer.json records the
// slices' bounds and the flat order. A resume puts the slices of every writer together, splits
// them into one state per parameter, and gives its optimizer what it needs: its own slice in its
// own flat order (ZeRO), or every parameter's state (replicated). So the world size, the shards,
// the stage, the bucket sizes and ZeRO itself may change between writing and resuming. A ZeRO
// engine resuming a ZeRO checkpoint of its own flat order reads only the parts of each writer's
// slices that overlap its own, so a small budget holds its resume.
#include <ATen/ATen.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include "checkpoint/checkpoint_archive.h"
#include "chorus/core/error.h"
#include "train/data_parallel_engine.h"
#include "train/layer_state_restore.h"

namespace chorus::runtime {
namespace {

constexpr const char* kPrefix = "zero/";
constexpr const char* kStep = "step";
// ZeRO-3's rank files hold their slice of the parameters under this name, beside the optimizer's.
constexpr const char* kParameters = "parameters";

// The optimizer state of every parameter, flattened, by state name ("exp_avg", ...; model order),
// with AdamW's step count.
struct ParameterStates {
  std::map<std::string, std::vector<at::Tensor>> tensors;
  std::optional<std::int64_t> step;
};

// The part [begin, end) of the flat space of every state a ZeRO checkpoint with `bounds` saved
// (and of its parameters, ZeRO-3), by name, reading of each writer's slice only what overlaps it:
// a rank's own slice for a resume in the same flat order (a rank with a small budget could not
// hold the whole state), or all of it. "step" comes from the first writer.
std::map<std::string, at::Tensor> savedSlices(const CheckpointSource& source,
                                              const std::vector<std::int64_t>& bounds,
                                              std::int64_t begin, std::int64_t end) {
  std::map<std::string, std::vector<at::Tensor>> pieces;
  std::map<std::string, at::Tensor> slices;
  for (size_t rank = 0; rank + 1 < bounds.size(); ++rank) {
    const std::int64_t from = std::max(begin, bounds[rank]), to = std::min(end, bounds[rank + 1]);
    if (from >= to && rank > 0) continue;  // the first writer's file names the states
    auto archive = archiveOf(source.read(rankFile(static_cast<int>(rank))));
    for (const std::string& key : archive.keys()) {
      if (key.rfind(kPrefix, 0) != 0) continue;
      const std::string name = key.substr(std::string(kPrefix).size());
      if (name != kStep && from >= to) {
        pieces[name];
        continue;
      }
      at::Tensor value;
      archive.read(key, value);
      if (name == kStep) {
        if (slices.count(kStep) == 0) slices[kStep] = value;
        continue;
      }
      if (value.numel() != bounds[rank + 1] - bounds[rank])
        CHORUS_THROW(CheckpointError, "checkpoint '", source.dir, "': rank ", rank, "'s '", name,
                     "' holds ", value.numel(), " elements, its slice ",
                     bounds[rank + 1] - bounds[rank]);
      pieces[name].push_back(value.reshape({-1}).narrow(0, from - bounds[rank], to - from).clone());
    }
  }
  for (auto& [name, parts] : pieces) {
    at::Tensor slice = parts.empty() ? at::empty({0}, at::kFloat) : at::cat(parts);
    if (slice.numel() != end - begin)
      CHORUS_THROW(CheckpointError, "checkpoint '", source.dir, "': '", name, "' holds ",
                   slice.numel(), " of the ", end - begin, " elements of this rank's slice");
    slices[name] = slice;
  }
  return slices;
}

// The states of a ZeRO checkpoint, per parameter of `parameters`.
ParameterStates statesOfZeroCheckpoint(const CheckpointSource& source,
                                       const std::vector<at::Tensor>& parameters) {
  const nlohmann::json& saved = source.saved.at("zero");
  const auto bounds = saved.at("bounds").get<std::vector<std::int64_t>>();
  const auto order = saved.at("order").get<std::vector<int>>();
  std::int64_t total = 0;
  for (const at::Tensor& parameter : parameters) total += parameter.numel();
  if (bounds.empty() || bounds.back() != total || order.size() != parameters.size())
    source.mismatch("the parameters", std::to_string(bounds.empty() ? 0 : bounds.back()),
                    std::to_string(total));
  ParameterStates states;
  for (const auto& [name, whole] : savedSlices(source, bounds, 0, total)) {
    if (name == kStep) {
      states.step = static_cast<std::int64_t>(whole.item<double>());
      continue;
    }
    std::vector<at::Tensor>& per_parameter = states.tensors[name];
    per_parameter.resize(parameters.size());
    std::int64_t position = 0;
    for (int index : order) {
      if (index < 0 || index >= static_cast<int>(parameters.size()))
        source.mismatch("the flat order", std::to_string(index), "a parameter index");
      per_parameter[index] = whole.narrow(0, position, parameters[index].numel());
      position += parameters[index].numel();
    }
  }
  return states;
}

// The states of a replicated checkpoint's optimizer.pt, loaded into an optimizer of the job's
// kind over stand-ins of `parameters` (their shapes: a ZeRO-3 engine's hold no values).
ParameterStates statesOfReplicatedCheckpoint(const CheckpointSource& source,
                                             const OptimizerSection& section,
                                             const std::vector<at::Tensor>& parameters) {
  std::vector<at::Tensor> copies;
  for (const at::Tensor& parameter : parameters)
    copies.push_back(at::zeros(parameter.sizes(), parameter.options()).requires_grad_(true));
  auto optimizer = makeOptimizer(section, copies);
  auto archive = archiveOf(source.read("optimizer.pt"));
  optimizer->load(archive);
  ParameterStates states;
  for (size_t index = 0; index < copies.size(); ++index) {
    const auto found = optimizer->state().find(copies[index].unsafeGetTensorImpl());
    if (found == optimizer->state().end()) continue;  // before the first step
    auto& entry = states.tensors;
    if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(found->second.get())) {
      if (!sgd->momentum_buffer().defined()) continue;
      entry["momentum_buffer"].resize(copies.size());
      entry["momentum_buffer"][index] = sgd->momentum_buffer().reshape({-1});
    } else if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(found->second.get())) {
      entry["exp_avg"].resize(copies.size());
      entry["exp_avg_sq"].resize(copies.size());
      entry["exp_avg"][index] = adamw->exp_avg().reshape({-1});
      entry["exp_avg_sq"][index] = adamw->exp_avg_sq().reshape({-1});
      states.step = adamw->step();
    }
  }
  return states;
}

// ZeRO-3's saved parameters, flattened, in the model's order, taken out of `states`; empty when
// the checkpoint has a model file instead.
std::vector<at::Tensor> takeSavedParameters(ParameterStates& states) {
  const auto found = states.tensors.find(kParameters);
  if (found == states.tensors.end()) return {};
  std::vector<at::Tensor> values = std::move(found->second);
  states.tensors.erase(found);
  return values;
}

// ZeRO-3's master slice of `zero` from the checkpoint's model file, one parameter at a time;
// `parameters` are the model's, in its order.
void loadMasterFromModelFile(const model::ZooModel& model,
                             const std::vector<at::Tensor>& parameters,
                             parallel::ZeroOptimizer& zero, const CheckpointSource& source) {
  auto archive = archiveOf(source.read("model.pt"));
  std::vector<std::string> names;
  for (const auto& item : model.named_parameters()) names.push_back(item.key());
  zero.loadMaster([&](int index) {
    at::Tensor value;
    archive.read(names.at(index), value);
    const std::int64_t numel = parameters.at(index).numel();
    if (value.numel() != numel)
      source.mismatch("parameter '" + names[index] + "'", std::to_string(value.numel()),
                      std::to_string(numel) + " elements");
    return value;
  });
}

// The replica of the successor's slice (zero.redundancy), read as restoreOwnSlices reads the
// rank's own: the state, and ZeRO-3's parameters (or, without them, the model file's values that
// loadMasterFromModelFile gave it already).
void restoreReplica(parallel::ZeroOptimizer& zero, const CheckpointSource& source,
                    const std::vector<std::int64_t>& bounds) {
  auto slices = savedSlices(source, bounds, zero.replicaBegin(), zero.replicaEnd());
  const auto parameters = slices.find(kParameters);
  if (parameters != slices.end()) {
    zero.loadReplicaMasterSlice(parameters->second);
    slices.erase(parameters);
  }
  zero.loadReplicaState(slices);
}

// Whole flat states in `order`, as ZeroOptimizer::loadWholeState takes them. A parameter without
// a state (its optimizer never stepped it) gets zeros.
std::map<std::string, at::Tensor> wholeFlatStates(const ParameterStates& states,
                                                  const std::vector<at::Tensor>& parameters,
                                                  const std::vector<int>& order) {
  std::map<std::string, at::Tensor> whole;
  for (const auto& [name, per_parameter] : states.tensors) {
    std::vector<at::Tensor> parts;
    for (int index : order)
      parts.push_back(per_parameter[index].defined()
                          ? per_parameter[index]
                          : at::zeros({parameters[index].numel()}, at::kFloat));
    whole[name] = at::cat(parts);
  }
  if (states.step) whole[kStep] = at::tensor({static_cast<double>(*states.step)}, at::kDouble);
  return whole;
}

// Every parameter's state into a replicated optimizer over `parameters`.
void loadReplicated(torch::optim::Optimizer& optimizer, const ParameterStates& states,
                    const std::vector<at::Tensor>& parameters) {
  for (size_t index = 0; index < parameters.size(); ++index) {
    void* key = parameters[index].unsafeGetTensorImpl();
    const auto tensor = [&](const char* name) {
      return states.tensors.at(name)[index].view(parameters[index].sizes()).clone();
    };
    if (states.tensors.count("momentum_buffer") > 0) {
      auto state = std::make_unique<torch::optim::SGDParamState>();
      state->momentum_buffer(tensor("momentum_buffer"));
      optimizer.state()[key] = std::move(state);
    } else if (states.tensors.count("exp_avg") > 0) {
      auto state = std::make_unique<torch::optim::AdamWParamState>();
      state->exp_avg(tensor("exp_avg"));
      state->exp_avg_sq(tensor("exp_avg_sq"));
      state->step(states.step.value_or(0));
      optimizer.state()[key] = std::move(state);
    }
  }
}

}  // namespace

void DataParallelEngine::writeZeroSlice(torch::serialize::OutputArchive& archive) const {
  for (const auto& [name, tensor] : zero_->sliceState()) archive.write(kPrefix + name, tensor);
  if (zero_layers_) archive.write(std::string(kPrefix) + kParameters, zero_->masterSlice().clone());
}

nlohmann::json DataParallelEngine::zeroEntry() const {
  // Each parameter's name and shape, in the model's order: what `chorus checkpoint consolidate`
  // needs to rebuild model.pt from a ZeRO-3 checkpoint's slices without the job's model or data.
  nlohmann::json names = nlohmann::json::array(), shapes = nlohmann::json::array();
  for (const auto& item : model_->named_parameters()) {
    names.push_back(item.key());
    shapes.push_back(item.value().sizes().vec());
  }
  return {{"stage", zero_->stage()},
          {"bounds", zero_->bounds()},
          {"order", zero_->order()},
          {"names", names},
          {"shapes", shapes}};
}

// Reads only the overlap of each writer's slices with this rank's (savedSlices).
bool DataParallelEngine::restoreOwnSlices(const CheckpointSource& source) {
  const nlohmann::json& saved = source.saved.at("zero");
  if (saved.at("order").get<std::vector<int>>() != zero_->order()) return false;
  if (saved.value("stage", 0) >= 3 && !zero_layers_) return false;
  const auto bounds = saved.at("bounds").get<std::vector<std::int64_t>>();
  if (bounds.empty() || bounds.back() != zero_->bounds().back())
    source.mismatch("the parameters", std::to_string(bounds.empty() ? 0 : bounds.back()),
                    std::to_string(zero_->bounds().back()));
  auto slices = savedSlices(source, bounds, zero_->begin(), zero_->end());
  const auto parameters = slices.find(kParameters);
  if (parameters != slices.end()) {
    zero_->loadMasterSlice(parameters->second);
    slices.erase(parameters);
  } else if (zero_layers_) {
    loadMasterFromModelFile(*model_, model_parameters_, *zero_, source);
  }
  zero_->loadSliceState(slices);
  if (zero_->redundant()) restoreReplica(*zero_, source, bounds);
  if (!zero_layers_) zero_->loadMasterFromParameters();  // loaded by restore()
  return true;
}

void DataParallelEngine::restoreOptimizer(const CheckpointSource& source) {
  const std::vector<at::Tensor>& parameters = model_parameters_;
  const bool sharded = source.saved.contains("zero");
  if (!zero_ && !sharded) {
    auto archive = archiveOf(source.read("optimizer.pt"));
    optimizer_->load(archive);
    moveStatesToParameters(*optimizer_);  // the file may come from another device
    return;
  }
  if (zero_ && sharded && restoreOwnSlices(source)) return;
  ParameterStates states = sharded
                               ? statesOfZeroCheckpoint(source, parameters)
                               : statesOfReplicatedCheckpoint(source, job_.optimizer, parameters);
  const std::vector<at::Tensor> saved = takeSavedParameters(states);
  if (!zero_layers_ && !saved.empty()) {  // a ZeRO-3 checkpoint: no model file was loaded
    at::NoGradGuard no_grad;
    for (size_t index = 0; index < parameters.size(); ++index)
      parameters[index].detach().view({-1}).copy_(saved.at(index));
  }
  if (!zero_) {
    loadReplicated(*optimizer_, states, parameters);
    return;
  }
  zero_->loadWholeState(wholeFlatStates(states, parameters, zero_->order()));
  if (!zero_layers_)
    zero_->loadMasterFromParameters();  // the model was loaded before (restore())
  else if (saved.empty())
    loadMasterFromModelFile(*model_, model_parameters_, *zero_, source);
  else
    zero_->loadMaster([&](int index) { return saved.at(index); });
}

}  // namespace chorus::runtime
