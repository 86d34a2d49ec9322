#include "chorus/plan/memory_model.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "chorus/core/error.h"

namespace chorus::plan {
namespace {

// Parameters are fp32 whatever the compute format (memory_model.h, "state").
constexpr double kParameterBytes = 4;

// table[k][i] = max of values[i, i + 2^k).
std::vector<std::vector<double>> sparseTable(const std::vector<double>& values) {
  std::vector<std::vector<double>> table{values};
  for (size_t width = 2; width <= values.size(); width *= 2) {
    const auto& previous = table.back();
    std::vector<double> next(values.size() - width + 1);
    for (size_t i = 0; i < next.size(); ++i)
      next[i] = std::max(previous[i], previous[i + width / 2]);
    table.push_back(std::move(next));
  }
  return table;
}

}  // namespace

const char* toString(Checkpointing checkpointing) {
  switch (checkpointing) {
    case Checkpointing::kNone:
      return "none";
    case Checkpointing::kStage:
      return "stage";
    case Checkpointing::kLayer:
      return "layer";
  }
  return "?";
}

MemoryModel::MemoryModel(ModelProfile model, MemoryOptions options)
    : model_(std::move(model)), options_(options) {
  model_.validate();
  CHORUS_CHECK_CONFIG(
      std::isfinite(options_.optimizer_state_bytes) && options_.optimizer_state_bytes >= 0,
      "memory model: optimizer_state_bytes must be >= 0, got ", options_.optimizer_state_bytes);
  const int layers = model_.layerCount();
  params_.assign(layers + 1, 0);
  kept_.assign(layers + 1, 0);
  outputs_.assign(layers + 1, 0);
  std::vector<double> widest(layers), backward(layers), recompute(layers);
  for (int l = 0; l < layers; ++l) {
    const LayerProfile& layer = model_.layers[l];
    params_[l + 1] = params_[l] + layer.params;
    kept_[l + 1] = kept_[l] + layer.activation_bytes;
    outputs_[l + 1] = outputs_[l] + layer.output_bytes;
    widest[l] = layer.params;
    backward[l] = kept_[l + 1] + layer.workspace_bytes;
    recompute[l] = outputs_[l] + layer.activation_bytes + layer.workspace_bytes;
  }
  widest_ = sparseTable(widest);
  backward_peak_ = sparseTable(backward);
  recompute_peak_ = sparseTable(recompute);
  log2_.assign(layers + 1, 0);
  for (int n = 2; n <= layers; ++n) log2_[n] = log2_[n / 2] + 1;
}

double MemoryModel::rangeMax(const std::vector<std::vector<double>>& table, int first,
                             int last) const {
  const int level = log2_[last - first];
  return std::max(table[level][first], table[level][last - (1 << level)]);
}

double MemoryModel::activationsPerSample(const StageMemoryRequest& request) const {
  const int first = request.first_layer, last = request.last_layer;
  // A later stage receives its input, which autograd keeps as the leaf of the stage's graph.
  const double input = first > 0 ? model_.layers[first - 1].output_bytes : 0;
  // What a micro-batch keeps between its passes, and the peak of its backward pass (with its
  // recomputation) on top of what the rank's other micro-batches keep.
  double kept = 0, peak = 0;
  switch (request.checkpointing) {
    case Checkpointing::kNone:
    case Checkpointing::kStage:
      // Backward at layer l: layers [first, l] still hold what they kept, l adds its workspace.
      peak = input + rangeMax(backward_peak_, first, last) - kept_[first];
      kept = request.checkpointing == Checkpointing::kNone ? input + kept_[last] - kept_[first]
                                                           : input;
      break;
    case Checkpointing::kLayer:
      // Recomputing layer l: the inputs of layers [first, l] and layer l's whole graph.
      peak = input + rangeMax(recompute_peak_, first, last) - outputs_[first];
      kept = input + outputs_[last - 1] - outputs_[first];
      peak = std::max(peak, kept);
      break;
  }
  const int others = std::max(0, request.in_flight - 1);
  return others * kept + peak;
}

MemoryEstimate MemoryModel::estimate(const StageMemoryRequest& request) const {
  const int first = request.first_layer, last = request.last_layer;
  CHORUS_CHECK_CONFIG(first >= 0 && first < last && last <= model_.layerCount(),
                      "memory model: layers [", first, ", ", last, ") are not a range of model '",
                      model_.name, "' (", model_.layerCount(), " layers)");
  CHORUS_CHECK_CONFIG(request.micro_batch >= 0 && request.in_flight >= 1 && request.group >= 1 &&
                          request.zero_stage >= 0 && request.zero_stage <= 3,
                      "memory model: micro_batch must be >= 0, in_flight and group >= 1, "
                      "zero_stage 0-3");
  const double params = params_[last] - params_[first];
  const int zero = request.zero_stage;
  const double shard = request.group;
  MemoryEstimate bytes;
  bytes.weights = params * kParameterBytes / (zero >= 3 ? shard : 1);
  bytes.gradients = params * kParameterBytes / (zero >= 2 ? shard : 1);
  bytes.optimizer = params * options_.optimizer_state_bytes / (zero >= 1 ? shard : 1);
  if (request.gradient_buckets) bytes.buffers += params * kParameterBytes / (zero >= 2 ? shard : 1);
  // ZeRO-3 gathers one layer's full weights at a time.
  if (zero >= 3 && request.group > 1)
    bytes.buffers += rangeMax(widest_, first, last) * kParameterBytes;
  // Autocast caches a 16-bit copy of every weight it lowers during the forward pass.
  const double element = bytesOf(request.dtype);
  if (element < kParameterBytes) bytes.buffers += params * element;
  const double scale = element / model_.activation_element_bytes;
  bytes.activations = request.micro_batch * activationsPerSample(request) * scale;
  return bytes;
}

std::int64_t MemoryModel::largestMicroBatch(StageMemoryRequest request, double capacity,
                                            std::int64_t limit) const {
  CHORUS_CHECK_CONFIG(limit >= 1, "memory model: a micro-batch limit must be >= 1, got ", limit);
  request.micro_batch = 0;
  const double fixed = peakBytes(request);
  request.micro_batch = 1;
  const double per_sample = peakBytes(request) - fixed;
  if (fixed + per_sample > capacity) return 0;
  if (per_sample <= 0) return limit;
  const double fits = std::floor((capacity - fixed) / per_sample);
  return fits >= static_cast<double>(limit) ? limit : static_cast<std::int64_t>(fits);
}

std::vector<double> rankMemory(const MemoryModel& memory, const Plan& plan,
                               Checkpointing checkpointing) {
  std::vector<double> bytes(plan.ranks.size(), 0);
  const int stages = plan.stageCount();
  for (const ReplicaPlan& replica : plan.replicas)
    for (int s = 0; s < stages; ++s) {
      const StagePlan& stage = replica.stages[s];
      StageMemoryRequest request;
      request.first_layer = stage.first_layer;
      request.last_layer = stage.last_layer;
      request.dtype = plan.ranks.at(stage.rank).precision;
      request.micro_batch = stage.micro_batch;
      // 1F1B holds at most S - s micro-batches on stage s, GPipe all of them.
      request.in_flight = stages == 1 ? 1
                          : plan.schedule == Schedule::kGpipe
                              ? plan.micro_batches
                              : std::min(stages - s, plan.micro_batches);
      request.checkpointing = stage.checkpoint ? checkpointing : Checkpointing::kNone;
      request.zero_stage = plan.zero_stage;
      request.group = static_cast<int>(plan.replicas.size());
      request.gradient_buckets = stages == 1;
      bytes[stage.rank] = memory.peakBytes(request);
    }
  return bytes;
}

}  // namespace chorus::plan
