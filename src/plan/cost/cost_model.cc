// Compute and memory terms of the cost model (plan_cost.cc prices whole plans with them).
#include "chorus/plan/cost_model.h"

#include <algorithm>
#include <cmath>

#include "chorus/core/error.h"
#include "chorus/core/name_table.h"

namespace chorus::plan {
namespace {

// coreSlowdown() of every CPU type on a node with core contention.
std::vector<std::pair<std::string, double>> coreSlowdowns(const Cluster& cluster) {
  std::vector<std::pair<std::string, double>> slowdowns;
  for (const Node& node : cluster.nodes()) {
    if (node.core_contention <= 0) continue;
    double busy = 0;  // cores the node's CPU workers keep busy, all together
    for (int id : node.devices)
      if (cluster.device(id).type.device_class == DeviceClass::kCpu)
        busy += cluster.device(id).type.core_fraction;
    for (int id : node.devices) {
      const DeviceType& type = cluster.device(id).type;
      if (type.device_class != DeviceClass::kCpu) continue;
      const double others = std::min(1.0, std::max(0.0, busy - type.core_fraction));
      const double factor = 1 + node.core_contention * others;
      auto known = std::find_if(slowdowns.begin(), slowdowns.end(),
                                [&](const auto& entry) { return entry.first == type.name; });
      if (known == slowdowns.end())
        slowdowns.emplace_back(type.name, factor);
      else
        known->second = std::max(known->second, factor);
    }
  }
  return slowdowns;
}

constexpr NamedValue<PrecisionPolicy> kPrecisionPolicyNames[] = {
    {PrecisionPolicy::kFp32, "fp32"},
    {PrecisionPolicy::kTf32, "tf32"},
    {PrecisionPolicy::kMixed, "mixed"}};

}  // namespace

const char* toString(PrecisionPolicy policy) { return nameOf(kPrecisionPolicyNames, policy); }

PrecisionPolicy parsePrecisionPolicy(const std::string& text) {
  if (auto policy = valueNamed(kPrecisionPolicyNames, text)) return *policy;
  CHORUS_THROW(ConfigError, "unknown precision policy '", text,
               "'; known: ", namesOf(kPrecisionPolicyNames));
}

CostModel::CostModel(const Cluster& cluster, const ModelProfile& model, CostOptions options)
    : cluster_(cluster),
      model_(model),
      options_(std::move(options)),
      memory_(model, MemoryOptions{options_.optimizer_state_bytes}) {
  const int layers = model_.layerCount();
  prefix_params_.assign(layers + 1, 0);
  prefix_flops_.assign(layers + 1, 0);
  prefix_activation_.assign(layers + 1, 0);
  for (int i = 0; i < layers; ++i) {
    const LayerProfile& layer = model_.layers[i];
    prefix_params_[i + 1] = prefix_params_[i] + layer.params;
    prefix_flops_[i + 1] = prefix_flops_[i] + layer.forward_flops;
    prefix_activation_[i + 1] = prefix_activation_[i] + layer.activation_bytes;
  }
  slowdown_ = coreSlowdowns(cluster_);
}

double CostModel::coreSlowdown(const DeviceType& type) const {
  for (const auto& [name, factor] : slowdown_)
    if (name == type.name) return factor;
  return 1;
}

Dtype CostModel::trainingDtype(const DeviceType& type, PrecisionPolicy policy) {
  if (policy == PrecisionPolicy::kMixed) {
    if (type.supports(Dtype::kBf16)) return Dtype::kBf16;
    if (type.supports(Dtype::kFp16)) return Dtype::kFp16;
  }
  if (policy == PrecisionPolicy::kTf32 && type.supports(Dtype::kTf32)) return Dtype::kTf32;
  return Dtype::kFp32;
}

double CostModel::efficiency(const DeviceType& type, Dtype dtype) const {
  for (const auto& calibration : options_.calibrations)
    if (calibration.device_type == type.name && calibration.dtype == dtype)
      return calibration.efficiency;
  if (type.efficiency > 0) return type.efficiency;
  if (type.device_class == DeviceClass::kCpu) return options_.cpu_efficiency;
  return options_.gpu_efficiency[static_cast<int>(dtype)];
}

double CostModel::capacity(const DeviceType& type) const {
  const double reserved = type.device_class == DeviceClass::kCpu ? options_.cpu_reserved_bytes
                                                                 : options_.gpu_reserved_bytes;
  return std::max(
      0.0, (static_cast<double>(type.memory_bytes) - reserved) * (1 - options_.memory_headroom));
}

double CostModel::forwardSeconds(const DeviceType& type, Dtype dtype, int first, int last,
                                 double micro_batch) const {
  const double flops = (prefix_flops_[last] - prefix_flops_[first]) * micro_batch;
  const double math = flops / (type.peak(dtype) * efficiency(type, dtype));
  const double scale = static_cast<double>(bytesOf(dtype)) / model_.activation_element_bytes;
  const double bytes = params(first, last) * bytesOf(dtype) +
                       (prefix_activation_[last] - prefix_activation_[first]) * micro_batch * scale;
  const double streaming = bytes / (type.memory_bandwidth * options_.memory_efficiency);
  const double seconds = (last - first) * layerOverhead(type) + std::max(math, streaming);
  return slowdown_.empty() ? seconds : seconds * coreSlowdown(type);
}

double CostModel::layerOverhead(const DeviceType& type) const {
  // A CPU worker with part of a core (an emulated one sleeps the rest) is that much slower at the
  // framework's per-operator work too; a GPU's launch overhead is the host's, not the device's.
  if (type.device_class != DeviceClass::kCpu || type.core_fraction <= 0)
    return options_.layer_overhead_seconds;
  return options_.layer_overhead_seconds / std::min(1.0, type.core_fraction);
}

double CostModel::microBatchSeconds(const DeviceType& type, Dtype dtype, int first, int last,
                                    double micro_batch, bool checkpoint) const {
  return forwardSeconds(type, dtype, first, last, micro_batch) * (checkpoint ? 4 : 3);
}

double CostModel::stageMemory(Dtype dtype, int first, int last, double micro_batch, int in_flight,
                              int zero_stage, int group, bool checkpoint, int micro_batches,
                              double shard_fraction) const {
  StageMemoryRequest request = trainerStageRequest(
      first, last, memory_.model().layerCount(), dtype, micro_batch, in_flight, micro_batches,
      zero_stage, group, checkpoint ? Checkpointing::kLayer : Checkpointing::kNone);
  request.shard_fraction = shard_fraction;
  return memory_.peakBytes(request);
}

double CostModel::boundaryBytes(Dtype dtype, int last, double micro_batch) const {
  const double scale = static_cast<double>(bytesOf(dtype)) / model_.activation_element_bytes;
  return model_.layers[last - 1].output_bytes * micro_batch * scale;
}

double CostModel::optimizerSeconds(const DeviceType& type, double parameters, int shard) const {
  return parameters / std::max(1, shard) * options_.optimizer_traffic_bytes /
         (type.memory_bandwidth * options_.memory_efficiency);
}

}  // namespace chorus::plan
