#include "chorus/plan/memory_model.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "chorus/core/error.h"
#include "chorus/core/name_table.h"
#include "chorus/core/units.h"
#include "model/sharded_split.h"

namespace chorus::plan {
namespace {

// Parameters are fp32 whatever the compute format (memory_model.h, "state").
constexpr double kParameterBytes = 4;
// ZeRO-3's layers gathered at once at most: the one running and the next (parallel/zero_layers.h;
// in backward autograd accumulates a layer's gradients, which frees it, before it runs the layer
// below).
constexpr double kGatheredLayers = 2;

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

constexpr NamedValue<Checkpointing> kCheckpointingNames[] = {{Checkpointing::kNone, "none"},
                                                             {Checkpointing::kStage, "stage"},
                                                             {Checkpointing::kLayer, "layer"}};

}  // namespace

const char* toString(Checkpointing checkpointing) {
  return nameOf(kCheckpointingNames, checkpointing);
}

Checkpointing parseCheckpointing(const std::string& name) {
  // Also read as a switch: "off" is none, "on" checkpoints each stage.
  if (name == "off") return Checkpointing::kNone;
  if (name == "on") return Checkpointing::kStage;
  if (auto checkpointing = valueNamed(kCheckpointingNames, name)) return *checkpointing;
  CHORUS_THROW(ConfigError, "unknown activation checkpointing '", name, "' (choose ",
               namesOf(kCheckpointingNames, ", ", " or "), ")");
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

MemoryModel::PerSample MemoryModel::activationsPerSample(const StageMemoryRequest& request) const {
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
  return {std::max(0, request.in_flight - 1) * kept, peak};
}

double MemoryModel::progressivePeak(const StageMemoryRequest& request, double scale) const {
  const int first = request.first_layer, last = request.last_layer;
  const double input = first > 0 ? model_.layers[first - 1].output_bytes : 0;
  double peak = 0;
  for (int l = first; l < last; ++l) {
    const double activations = request.checkpointing == Checkpointing::kLayer
                                   ? input + recompute_peak_[0][l] - outputs_[first]
                                   : input + backward_peak_[0][l] - kept_[first];
    const double gradients = (params_[last] - params_[l]) * kParameterBytes;
    peak = std::max(peak, activations * scale * request.micro_batch + gradients);
  }
  return activationsPerSample(request).others * scale * request.micro_batch + peak;
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
  CHORUS_CHECK_CONFIG(request.shard_fraction >= 0 && request.shard_fraction <= 1,
                      "memory model: shard_fraction must be in [0, 1]");
  const int zero = request.zero_stage;
  // Divided, not multiplied by a fraction, for even shards: predictions stay bit-identical.
  const auto sharded = [&](double bytes, int from_stage) {
    if (zero < from_stage) return bytes;
    return request.shard_fraction > 0 ? bytes * request.shard_fraction : bytes / request.group;
  };
  MemoryEstimate bytes;
  bytes.weights = sharded(params * kParameterBytes, 3);
  // The local gradients are whole in every stage (parallel/zero.h): accumulated over micro-batches
  // before the reduction; ZeRO-2 frees each one as it is copied into its bucket.
  const double gradients = params * kParameterBytes;
  // ZeRO's optimizer steps an fp32 master copy of the rank's slice, with the slice's gradient;
  // in stage 3 that master slice is the rank's weights (counted above).
  const double slice_copies = zero >= 3 ? 1 : zero >= 1 ? 2 : 0;
  bytes.optimizer = sharded(params * options_.optimizer_state_bytes, 1) +
                    sharded(slice_copies * params * kParameterBytes, 1);
  // A replica of the successor's slice: its state, its master copy and its gradient.
  CHORUS_CHECK_CONFIG(request.replica_fraction >= 0 && request.replica_fraction <= 1,
                      "memory model: replica_fraction must be in [0, 1]");
  if (zero >= 1)
    bytes.optimizer +=
        request.replica_fraction * params * (options_.optimizer_state_bytes + 2 * kParameterBytes);
  // ZeRO-2's buckets live only while their reduce-scatter runs; the others for the whole step.
  if (request.gradient_buckets && zero < 2) bytes.buffers += params * kParameterBytes;
  // ZeRO-3 gathers a layer's full weights while it runs and the next one's ahead of it.
  if (zero >= 3 && request.group > 1)
    bytes.buffers += kGatheredLayers * rangeMax(widest_, first, last) * kParameterBytes;
  // Autocast caches a 16-bit copy of every weight it lowers during the forward pass.
  const double element = bytesOf(request.dtype);
  if (element < kParameterBytes) bytes.buffers += params * element;
  const double scale = element / model_.activation_element_bytes;
  // The ends of a pipeline (and a one-stage replica) load inputs and targets together, before
  // anything else of the step is allocated, then hold the part their layers need.
  const bool head = first == 0, tail = last == model_.layerCount();
  const double samples = request.micro_batch * request.batch_micro_batches;
  const double loaded = head || tail ? samples * (model_.input_bytes + model_.target_bytes) : 0;
  const double data =
      samples * ((head ? model_.input_bytes : 0) + (tail ? model_.target_bytes : 0));
  // Transfers' buffers, at the rank's format.
  const double transfers =
      request.micro_batch * scale *
      (request.received_gradients * model_.layers[last - 1].output_bytes +
       (first > 0 ? request.prefetched_inputs * model_.layers[first - 1].output_bytes : 0));
  // Accumulating, each layer's new gradient is made beside the one it is added to.
  if (request.gradients_held) bytes.buffers += rangeMax(widest_, first, last) * kParameterBytes;
  if (request.gradients_held) {
    const PerSample per_sample = activationsPerSample(request);
    bytes.gradients = gradients;
    bytes.activations =
        data + transfers + request.micro_batch * (per_sample.others + per_sample.peak) * scale;
    bytes.activations = std::max(bytes.activations, loaded);
  } else {
    // The peak holds the gradients of the layers the backward pass has reached: counted with the
    // activations, as the two trade against each other.
    bytes.activations = std::max(loaded, data + transfers + progressivePeak(request, scale));
  }
  return bytes;
}

std::int64_t MemoryModel::largestMicroBatch(StageMemoryRequest request, double capacity,
                                            std::int64_t limit) const {
  CHORUS_CHECK_CONFIG(limit >= 1, "memory model: a micro-batch limit must be >= 1, got ", limit);
  // The peak grows with the micro-batch (piecewise linearly): bisect.
  const auto fits = [&](std::int64_t samples) {
    request.micro_batch = static_cast<double>(samples);
    return peakBytes(request) <= capacity;
  };
  if (!fits(1)) return 0;
  std::int64_t low = 1, high = limit;
  while (low < high) {
    const std::int64_t middle = low + (high - low + 1) / 2;
    if (fits(middle))
      low = middle;
    else
      high = middle - 1;
  }
  return low;
}

StageMemoryRequest trainerStageRequest(int first, int last, int layers, Dtype dtype,
                                       double micro_batch, int in_flight, int micro_batches,
                                       int zero_stage, int group, Checkpointing checkpointing) {
  const bool one_stage = first == 0 && last == layers;
  StageMemoryRequest request;
  request.first_layer = first;
  request.last_layer = last;
  request.dtype = dtype;
  request.micro_batch = micro_batch;
  request.in_flight = in_flight;
  request.checkpointing = checkpointing;
  request.zero_stage = zero_stage;
  request.group = group;
  request.gradient_buckets = one_stage;
  if (one_stage) {
    // The data-parallel trainer sets gradients to none before each step.
    request.gradients_held = micro_batches > 1;
  } else {
    request.batch_micro_batches = micro_batches;
    // The engine posts a stage's next receive before it computes (prefetch), and backward holds
    // the received gradient until the stage's backward pass ends.
    if (last < layers) request.received_gradients = std::min(2, in_flight + 1);
    if (first > 0) request.prefetched_inputs = 1;
  }
  return request;
}

std::vector<double> rankMemory(const MemoryModel& memory, const Plan& plan,
                               Checkpointing checkpointing) {
  std::vector<double> bytes(plan.ranks.size(), 0);
  const int stages = plan.stageCount();
  for (const ReplicaPlan& replica : plan.replicas)
    for (int s = 0; s < stages; ++s) {
      const StagePlan& stage = replica.stages[s];
      // 1F1B holds at most S - s micro-batches on stage s, GPipe all of them.
      const int in_flight = stages == 1 ? 1
                            : plan.schedule == Schedule::kGpipe
                                ? plan.micro_batches
                                : std::min(stages - s, plan.micro_batches);
      // A one-stage replica accumulates ceil(share / micro_batch) micro-batches.
      const int micro_batches =
          stages == 1 ? (replica.share + stage.micro_batch - 1) / std::max(1, stage.micro_batch)
                      : plan.micro_batches;
      StageMemoryRequest request = trainerStageRequest(
          stage.first_layer, stage.last_layer, memory.model().layerCount(),
          plan.ranks.at(stage.rank).precision, stage.micro_batch, in_flight, micro_batches,
          plan.zero_stage, static_cast<int>(plan.replicas.size()),
          stage.checkpoint ? checkpointing : Checkpointing::kNone);
      if (!plan.zero_shards.empty()) request.shard_fraction = plan.zero_shards.at(stage.rank);
      bytes[stage.rank] = memory.peakBytes(request);
    }
  return bytes;
}

ShardedSplit splitShardedState(const MemoryModel& memory,
                               std::vector<StageMemoryRequest> requests) {
  // The peak is linear in the fraction: f = 1 and f = 1/2 give the sharded and the fixed parts;
  // a whole replica (replica_fraction 1) over none gives what a replica adds per unit of it.
  ShardedSplit split;
  for (StageMemoryRequest& request : requests) {
    request.replica_fraction = 0;
    request.shard_fraction = 1;
    const double whole = memory.peakBytes(request);
    request.shard_fraction = 0.5;
    const double half = memory.peakBytes(request);
    request.replica_fraction = 1;
    split.replica.push_back(memory.peakBytes(request) - half);
    split.sharded = 2 * (whole - half);
    split.fixed.push_back(whole - split.sharded);
  }
  return split;
}

ShardedHeadroom shardedHeadroom(const MemoryModel& memory, std::vector<StageMemoryRequest> requests,
                                const std::vector<double>& usable,
                                const std::vector<std::string>& names) {
  CHORUS_CHECK_CONFIG(
      !requests.empty() && requests.size() == usable.size() && usable.size() == names.size(),
      "ZeRO shards by memory: one request, capacity and name per rank");
  ShardedHeadroom result{splitShardedState(memory, std::move(requests)), {}};
  for (size_t r = 0; r < usable.size(); ++r) {
    const double fixed = result.split.fixed[r];
    CHORUS_CHECK_CONFIG(
        fixed < usable[r], "ZeRO shards by memory: device '", names[r], "' (rank ", r,
        ") cannot hold even its unsharded part: ", formatBytes(static_cast<std::uint64_t>(fixed)),
        " of ", formatBytes(static_cast<std::uint64_t>(usable[r])), " usable");
    result.headroom.push_back(usable[r] - fixed);
  }
  return result;
}

namespace {

std::vector<double> proportionalFractions(const ShardedSplit& split,
                                          const std::vector<double>& usable) {
  double total = 0;
  for (size_t r = 0; r < usable.size(); ++r) total += usable[r] - split.fixed[r];
  std::vector<double> fractions;
  for (size_t r = 0; r < usable.size(); ++r)
    fractions.push_back((usable[r] - split.fixed[r]) / total);
  return fractions;
}

}  // namespace

StageMemoryRequest zeroShardRequest(int layers, Dtype dtype, int zero_stage, int group) {
  return trainerStageRequest(0, layers, layers, dtype, 1, 1, 2, zero_stage, group,
                             Checkpointing::kNone);
}

std::vector<double> zeroShardsByMemory(const MemoryModel& memory,
                                       std::vector<StageMemoryRequest> requests,
                                       const std::vector<double>& usable,
                                       const std::vector<std::string>& names) {
  const auto [split, headroom] = shardedHeadroom(memory, std::move(requests), usable, names);
  double total_headroom = 0;
  for (double rank_headroom : headroom) total_headroom += rank_headroom;
  CHORUS_CHECK_CONFIG(total_headroom >= split.sharded,
                      "ZeRO shards by memory: the devices together "
                      "have ",
                      formatBytes(static_cast<std::uint64_t>(total_headroom)),
                      " left for the sharded state, which needs ",
                      formatBytes(static_cast<std::uint64_t>(split.sharded)));
  return proportionalFractions(split, usable);
}

std::optional<std::vector<double>> fitZeroShardsByMemory(const MemoryModel& memory,
                                                         std::vector<StageMemoryRequest> requests,
                                                         const std::vector<double>& usable) {
  CHORUS_CHECK_CONFIG(!requests.empty() && requests.size() == usable.size(),
                      "ZeRO shards by memory: one request and capacity per rank");
  const ShardedSplit split = splitShardedState(memory, std::move(requests));
  double total_headroom = 0;
  for (size_t r = 0; r < usable.size(); ++r) {
    if (split.fixed[r] >= usable[r]) return std::nullopt;
    total_headroom += usable[r] - split.fixed[r];
  }
  if (total_headroom < split.sharded) return std::nullopt;
  return proportionalFractions(split, usable);
}

std::int64_t maxMicroBatch(const MemoryModel& memory, Dtype dtype, std::uint64_t budget_bytes,
                           const std::string& device, int zero_stage, int group,
                           double shard_fraction, double replica_fraction) {
  // The whole model on one rank, as if accumulating (gradients held through backward): the limit
  // must serve every share the balancer may give the rank.
  const int layers = memory.model().layerCount();
  StageMemoryRequest request = trainerStageRequest(
      0, layers, layers, dtype, 1, 1, /*micro_batches=*/2, zero_stage, group, Checkpointing::kNone);
  request.shard_fraction = shard_fraction;
  request.replica_fraction = replica_fraction;
  // A tenth of the budget spare: the model is within 15% of the measured peak (MemoryPrediction
  // in the runtime tests), and running out of a budget fails the step.
  const double budget = 0.9 * static_cast<double>(budget_bytes);
  // No micro-batch is larger than the largest share a rank can be given.
  constexpr std::int64_t kLimit = std::int64_t{1} << 40;
  const std::int64_t fits = memory.largestMicroBatch(request, budget, kLimit);
  if (fits < 1) {
    request.micro_batch = 0;
    const double fixed = memory.peakBytes(request);
    request.micro_batch = 1;
    const double one = memory.peakBytes(request);
    CHORUS_THROW(ConfigError, "device '", device, "': the memory budget of ",
                 formatBytes(budget_bytes),
                 " cannot hold one training sample of this model (needs ",
                 formatBytes(static_cast<std::uint64_t>(one)),
                 " and a tenth spare: ", formatBytes(static_cast<std::uint64_t>(fixed)),
                 " for weights, gradients and optimizer state, ",
                 formatBytes(static_cast<std::uint64_t>(one - fixed)), " per sample)");
  }
  return fits;
}

}  // namespace chorus::plan
