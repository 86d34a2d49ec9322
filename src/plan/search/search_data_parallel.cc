// Heterogeneous data parallelism: every device a replica, shares balanced so that all finish
// together. A rank's time for b samples is nondecreasing in b, so the min-max split is exact
// (share_split.h); per rank the fewest, most even micro-batches that fit its memory are best
// (compute per micro-batch is convex in its size and carries a fixed overhead), with or without
// activation checkpointing, whichever is faster.
#include <algorithm>

#include "cost/step_terms.h"
#include "search/searchers.h"
#include "search/share_split.h"

namespace chorus::plan::detail {
namespace {

// Micro-batches per step the searches price a data-parallel rank's memory with (see
// largestFitting).
constexpr int kAccumulating = 2;

// Largest micro-batch in [1, limit] whose memory fits `capacity` (0 when none).
int largestFitting(const CostModel& model, Dtype dtype, int layers, int zero_stage, int group,
                   double shard_fraction, bool checkpoint, double capacity, int limit) {
  auto fits = [&](int mb) {
    // Priced as if accumulating (gradients held through the backward pass), whatever the share:
    // one micro-batch size must serve every share the rank may get, and it only errs safe.
    return model.stageMemory(dtype, 0, layers, mb, 1, zero_stage, group, checkpoint, kAccumulating,
                             shard_fraction) <= capacity;
  };
  if (!fits(1)) return 0;
  int low = 1, high = limit;
  while (low < high) {
    const int mid = low + (high - low + 1) / 2;
    if (fits(mid))
      low = mid;
    else
      high = mid - 1;
  }
  return low;
}

}  // namespace

std::optional<RankChoices> dataParallelChoices(const CostModel& model, const PlanOptions& options,
                                               const DeviceType& type,
                                               const BucketedAllReduce& sync, int group,
                                               int zero_stage, double shard_fraction, int max_share,
                                               double after_sync) {
  const int layers = model.model().layerCount();
  const Dtype dtype = CostModel::trainingDtype(type, options.precision);
  const double capacity = model.capacity(type);
  int largest[2] = {0, 0};
  for (int checkpoint = 0; checkpoint < (options.allow_checkpointing ? 2 : 1); ++checkpoint)
    largest[checkpoint] = largestFitting(model, dtype, layers, zero_stage, group, shard_fraction,
                                         checkpoint, capacity, max_share);
  if (largest[0] == 0 && largest[1] == 0) return std::nullopt;
  RankChoices choices;
  for (int b = 1; b <= max_share; ++b) {
    double best = 0;
    int best_mb = 0;
    bool best_checkpoint = false;
    for (int checkpoint = 0; checkpoint < 2; ++checkpoint) {
      if (largest[checkpoint] == 0) continue;
      const int count = (b + largest[checkpoint] - 1) / largest[checkpoint];
      const int mb = (b + count - 1) / count;
      double backward = 0;
      const double compute =
          accumulateSeconds(model, type, dtype, 1.0, layers, b, mb, checkpoint, &backward);
      const double cost = hostSeconds(model, b) + compute + tailSeconds(sync, backward, after_sync);
      if (best_mb == 0 || cost < best) {
        best = cost;
        best_mb = mb;
        best_checkpoint = checkpoint;
      }
    }
    choices.cost.push_back(best);
    choices.micro_batch.push_back(best_mb);
    choices.checkpoint.push_back(best_checkpoint);
  }
  return choices;
}

std::optional<Plan> searchDataParallel(const CostModel& model, const PlanOptions& options,
                                       const DeviceSubset& subset, int zero_stage,
                                       const CommPlan& comm, bool equal_shares) {
  const Cluster& cluster = model.cluster();
  const std::vector<int>& devices = subset.devices;
  const int n = static_cast<int>(devices.size());
  if (n == 0 || options.global_batch < n) return std::nullopt;
  std::vector<Dtype> dtypes;
  for (int id : devices)
    dtypes.push_back(CostModel::trainingDtype(cluster.device(id).type, options.precision));
  const int element = gradElementBytes(dtypes);
  const double params = model.params(0, model.model().layerCount());
  const BucketedAllReduce sync =
      stageSync(model, stageSyncCost(model, devices, element, comm, zero_stage), element, params);
  const int max_share = options.global_batch - (n - 1);
  const auto shards = zeroShards(model, options, devices, zero_stage);
  if (!shards) return std::nullopt;
  // Every rank steps its optimizer after the reduction; the slowest one ends the step.
  const double after_sync =
      groupOptimizerSeconds(model, devices, params, zero_stage, *shards) +
      zeroGatherSeconds(zeroGatherCost(model, devices, comm, zero_stage), params);
  // One cost table per device type present.
  std::vector<RankChoices> classes;
  std::vector<int> class_of_type(cluster.types().size(), -1), class_of(n);
  for (int i = 0; i < n; ++i) {
    const Device& device = cluster.device(devices[i]);
    if (class_of_type[device.type_id] < 0) {
      // Devices of one type hold equal shards (zeroShards sizes them by type and format).
      auto choices = dataParallelChoices(model, options, device.type, sync, n, zero_stage,
                                         shards->empty() ? 0 : (*shards)[i], max_share, after_sync);
      if (!choices) return std::nullopt;
      class_of_type[device.type_id] = static_cast<int>(classes.size());
      classes.push_back(std::move(*choices));
    }
    class_of[i] = class_of_type[device.type_id];
  }
  std::vector<int> shares;
  if (equal_shares) {
    shares = equalSplit(options.global_batch, n);
  } else {
    std::vector<std::vector<double>> costs;
    for (const auto& c : classes) costs.push_back(c.cost);
    auto split = splitShares(costs, class_of, options.global_batch);
    if (!split) return std::nullopt;
    shares = std::move(*split);
  }
  std::vector<int> micro_batches(n);
  std::vector<bool> checkpoint(n);
  for (int i = 0; i < n; ++i) {
    micro_batches[i] = classes[class_of[i]].micro_batch[shares[i] - 1];
    checkpoint[i] = classes[class_of[i]].checkpoint[shares[i] - 1];
  }
  Plan plan = dataParallelPlan(model, options, devices, shares, micro_batches, checkpoint,
                               zero_stage, comm);
  plan.zero_shards = *shards;
  if (!price(model, plan)) return std::nullopt;
  return plan;
}

}  // namespace chorus::plan::detail
