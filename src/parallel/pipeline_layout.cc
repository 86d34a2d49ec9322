#include "chorus/parallel/pipeline_layout.h"

#include <algorithm>
#include <sstream>

#include "chorus/core/error.h"
#include "chorus/plan/pipeline_partition.h"

namespace chorus::parallel {
namespace {

std::vector<int> cutsFromCounts(const std::vector<int>& counts) {
  std::vector<int> cuts{0};
  for (int count : counts) cuts.push_back(cuts.back() + count);
  return cuts;
}

std::vector<int> evenCounts(int layers, int stages) {
  std::vector<int> counts(stages, layers / stages);
  for (int s = 0; s < layers % stages; ++s) ++counts[s];
  return counts;
}

// "3,2,1" -> {3, 2, 1}; ConfigError unless S positive counts summing to `layers`.
std::vector<int> explicitCounts(const std::string& text, int layers, int stages) {
  std::vector<int> counts;
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    std::size_t used = 0;
    int count = 0;
    try {
      count = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    CHORUS_CHECK_CONFIG(used == item.size() && !item.empty() && count >= 1, "pipeline partition '",
                        text, "': expected auto, even, or positive layer counts like 3,2,1");
    counts.push_back(count);
  }
  int total = 0;
  for (int count : counts) total += count;
  CHORUS_CHECK_CONFIG(static_cast<int>(counts.size()) == stages && total == layers,
                      "pipeline partition '", text, "': need ", stages,
                      " layer counts summing to the model's ", layers, " layers");
  return counts;
}

int inFlight(const PipelineOptions& options, int stage) {
  if (options.schedule == Schedule::kGpipe) return options.micro_batches;
  return std::min(options.pipeline_stages - stage, options.micro_batches);
}

const StageDevice& deviceOf(const CutRequest& request, int replica, int stage) {
  static const StageDevice kDefault{};
  if (request.devices.empty()) return kDefault;
  return request.devices.at(replica).at(stage);
}

// The plan's view of the model: parameters and forward FLOPs as profiled; the fp32 output as what
// a layer streams (the profile has no measured kept bytes, and every layer writes its output).
plan::ModelProfile planProfile(const std::vector<model::LayerProfile>& profile) {
  plan::ModelProfile model;
  model.name = "pipeline cut";
  model.activation_element_bytes = 4;
  for (const model::LayerProfile& layer : profile) {
    const double output = static_cast<double>(layer.activation_bytes);
    model.layers.push_back(
        {layer.name, static_cast<double>(layer.parameters), layer.forward_flops, output, output});
  }
  return model;
}

// plan::CostModel of the request's model. It holds references, so this owns what they name and
// stays in place. No cluster: the cut prices one device's compute, and no node's cores are shared.
class StagePricer {
 public:
  explicit StagePricer(const CutRequest& request)
      : request_(request),
        model_(planProfile(request.profile)),
        cost_(cluster_, model_, request.cost),
        checkpoint_(request.options.activation_checkpointing != Checkpointing::kNone) {}
  StagePricer(const StagePricer&) = delete;
  StagePricer& operator=(const StagePricer&) = delete;

  // stageSeconds() of layers [first, last).
  double seconds(int first, int last, double micro_batch) const {
    return cost_.microBatchSeconds(request_.reference, plan::Dtype::kFp32, first, last, micro_batch,
                                   checkpoint_);
  }

 private:
  const CutRequest& request_;
  plan::ModelProfile model_;
  plan::Cluster cluster_{"pipeline cut"};
  plan::CostModel cost_;
  bool checkpoint_;
};

// The automatic cut: time per micro-batch of the slowest replica at each stage, in the cost
// model's seconds; transfers and synchronization are left out.
std::vector<int> autoCuts(const CutRequest& request) {
  const PipelineOptions& options = request.options;
  const int layers = static_cast<int>(request.profile.size());
  const std::vector<std::int64_t> shares = replicaShares(options);
  const StagePricer pricer(request);
  const plan::StageCostFn cost = [&](int s, int first, int last) {
    plan::StageCost stage;
    for (int r = 0; r < options.replicas; ++r) {
      const StageDevice& device = deviceOf(request, r, s);
      const std::int64_t micro = (shares[r] + options.micro_batches - 1) / options.micro_batches;
      if (device.memory_bytes > 0 &&
          request.memory->peakBytes(stageMemoryRequest(options, layers, s, first, last, micro)) >
              static_cast<double>(device.memory_bytes))
        return plan::StageCost{};
      stage.time = std::max(stage.time,
                            pricer.seconds(first, last, static_cast<double>(micro)) / device.speed);
    }
    stage.feasible = true;
    stage.monotone = stage.time;
    return stage;
  };
  const auto partition =
      plan::partitionLayers(layers, options.pipeline_stages, options.micro_batches, cost);
  if (!partition)
    CHORUS_THROW(ConfigError, "no cut of ", layers, " layers into ", options.pipeline_stages,
                 " stages fits the devices' memory");
  return partition->cuts;
}

}  // namespace

void validatePipelineOptions(const PipelineOptions& options, std::int64_t layers) {
  CHORUS_CHECK_CONFIG(options.pipeline_stages >= 1, "pipeline.stages must be >= 1, got ",
                      options.pipeline_stages);
  CHORUS_CHECK_CONFIG(options.pipeline_stages <= layers, "pipeline.stages (",
                      options.pipeline_stages, ") exceeds the model's ", layers, " layers");
  CHORUS_CHECK_CONFIG(options.micro_batches >= 1, "pipeline.micro_batches must be >= 1, got ",
                      options.micro_batches);
  CHORUS_CHECK_CONFIG(options.replicas >= 1, "pipeline.replicas must be >= 1, got ",
                      options.replicas);
  CHORUS_CHECK_CONFIG(options.global_batch > 0, "pipeline global batch must be > 0, got ",
                      options.global_batch);
  CHORUS_CHECK_CONFIG(options.timeout.count() >= 0, "pipeline timeout must be >= 0");
  const std::vector<std::int64_t> shares = replicaShares(options);
  for (std::size_t r = 0; r < shares.size(); ++r)
    CHORUS_CHECK_CONFIG(shares[r] >= options.micro_batches, "replica ", r, "'s share of ",
                        shares[r], " samples is below its ", options.micro_batches,
                        " micro-batches");
  if (options.partition != "auto" && options.partition != "even")
    explicitCounts(options.partition, static_cast<int>(layers), options.pipeline_stages);
}

std::vector<std::int64_t> replicaShares(const PipelineOptions& options) {
  if (options.replica_shares.empty()) {
    CHORUS_CHECK_CONFIG(options.replicas >= 1, "pipeline.replicas must be >= 1");
    std::vector<std::int64_t> shares(options.replicas, options.global_batch / options.replicas);
    for (std::int64_t r = 0; r < options.global_batch % options.replicas; ++r) ++shares[r];
    return shares;
  }
  CHORUS_CHECK_CONFIG(static_cast<int>(options.replica_shares.size()) == options.replicas,
                      "pipeline: ", options.replica_shares.size(), " replica shares for ",
                      options.replicas, " replicas");
  std::int64_t total = 0;
  for (std::int64_t share : options.replica_shares) {
    CHORUS_CHECK_CONFIG(share >= 0, "pipeline: negative replica share ", share);
    total += share;
  }
  CHORUS_CHECK_CONFIG(total == options.global_batch, "pipeline: replica shares sum to ", total,
                      ", not the global batch ", options.global_batch);
  return options.replica_shares;
}

std::vector<std::int64_t> microBatchSizes(std::int64_t share, int micro_batches) {
  CHORUS_CHECK_CONFIG(micro_batches >= 1 && share >= micro_batches, "cannot split ", share,
                      " samples into ", micro_batches, " non-empty micro-batches");
  std::vector<std::int64_t> sizes(micro_batches, share / micro_batches);
  for (std::int64_t m = 0; m < share % micro_batches; ++m) ++sizes[m];
  return sizes;
}

PipelineLayout::PipelineLayout(int replicas, int stages) : replicas_(replicas), stages_(stages) {
  CHORUS_CHECK_CONFIG(replicas >= 1 && stages >= 1, "a pipeline layout needs replicas >= 1 and ",
                      "stages >= 1, got ", replicas, " x ", stages);
}

StagePosition PipelineLayout::positionOf(int rank) const {
  CHORUS_CHECK_CONFIG(rank >= 0 && rank < worldSize(), "rank ", rank, " is not in a pipeline of ",
                      worldSize(), " ranks");
  return StagePosition{rank / stages_, rank % stages_};
}

std::vector<int> PipelineLayout::stageGroup(int stage) const {
  std::vector<int> ranks;
  for (int r = 0; r < replicas_; ++r) ranks.push_back(rankOf(r, stage));
  return ranks;
}

std::vector<int> stageCuts(const CutRequest& request) {
  const PipelineOptions& options = request.options;
  const int layers = static_cast<int>(request.profile.size());
  validatePipelineOptions(options, layers);
  if (!request.devices.empty()) {
    CHORUS_CHECK_CONFIG(static_cast<int>(request.devices.size()) == options.replicas,
                        "pipeline cut: devices for ", request.devices.size(), " replicas, need ",
                        options.replicas);
    for (const auto& replica : request.devices) {
      CHORUS_CHECK_CONFIG(static_cast<int>(replica.size()) == options.pipeline_stages,
                          "pipeline cut: each replica needs ", options.pipeline_stages, " devices");
      for (const StageDevice& device : replica) {
        CHORUS_CHECK_CONFIG(device.speed > 0, "pipeline cut: device speed must be > 0");
        CHORUS_CHECK_CONFIG(device.memory_bytes == 0 || request.memory,
                            "pipeline cut: a device has a memory budget but the cut was given no "
                            "memory model");
      }
    }
  }
  if (options.partition == "even")
    return cutsFromCounts(evenCounts(layers, options.pipeline_stages));
  if (options.partition == "auto") return autoCuts(request);
  return cutsFromCounts(explicitCounts(options.partition, layers, options.pipeline_stages));
}

double stageSeconds(const CutRequest& request, int first, int last, double micro_batch) {
  const int layers = static_cast<int>(request.profile.size());
  CHORUS_CHECK_CONFIG(0 <= first && first <= last && last <= layers, "pipeline cut: layers [",
                      first, ", ", last, ") are not in a model of ", layers, " layers");
  CHORUS_CHECK_CONFIG(micro_batch >= 0, "pipeline cut: micro-batch of ", micro_batch, " samples");
  if (first == last) return 0;
  return StagePricer(request).seconds(first, last, micro_batch);
}

plan::StageMemoryRequest stageMemoryRequest(const PipelineOptions& options, int layers, int stage,
                                            int first, int last, std::int64_t micro_batch) {
  return plan::trainerStageRequest(first, last, layers, plan::Dtype::kFp32,
                                   static_cast<double>(micro_batch), inFlight(options, stage),
                                   options.micro_batches, /*zero_stage=*/0, options.replicas,
                                   options.activation_checkpointing);
}

}  // namespace chorus::parallel
