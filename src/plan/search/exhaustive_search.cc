// exhaustivePlan: the planner's search space walked without cleverness, as the reference the
// search is tested against. Every share vector, every micro-batch size per rank, every set of
// cuts and every checkpointing choice is priced; only the per-rank choice of micro-batch and
// checkpointing for a fixed share vector is minimized rank by rank, which is exact because a
// data-parallel step is the maximum of independent per-rank terms.
#include <functional>
#include <map>

#include "chorus/core/error.h"
#include "chorus/plan/planner.h"
#include "cost/step_terms.h"
#include "search/search_space.h"

namespace chorus::plan {
namespace {

struct RankBest {
  double cost = -1;
  int micro_batch = 0;
  bool checkpoint = false;
};

void keep(std::optional<Plan>& best, Plan plan) {
  if (!best || plan.predicted.step_seconds < best->predicted.step_seconds) best = std::move(plan);
}

RankBest bestForShare(const CostModel& model, const PlanOptions& options, const DeviceType& type,
                      const BucketedAllReduce& sync, int group, int zero, double shard_fraction,
                      int share, double after_sync) {
  const int layers = model.model().layerCount();
  const Dtype dtype = CostModel::trainingDtype(type, options.precision);
  RankBest best;
  for (int checkpoint = 0; checkpoint < (options.allow_checkpointing ? 2 : 1); ++checkpoint)
    for (int mb = 1; mb <= share; ++mb) {
      // Priced as if accumulating, as searchDataParallel does, so that the two agree.
      if (model.stageMemory(dtype, 0, layers, mb, 1, zero, group, checkpoint, 2, shard_fraction) >
          model.capacity(type))
        continue;
      double backward = 0;
      const double cost = detail::hostSeconds(model, share) +
                          detail::accumulateSeconds(model, type, dtype, 1.0, layers, share, mb,
                                                    checkpoint, &backward) +
                          detail::tailSeconds(sync, backward, after_sync);
      if (best.cost < 0 || cost < best.cost) best = {cost, mb, static_cast<bool>(checkpoint)};
    }
  return best;
}

void dataParallel(const CostModel& model, const PlanOptions& options,
                  const detail::DeviceSubset& subset, int zero, const CommPlan& comm,
                  std::optional<Plan>& best) {
  const Cluster& cluster = model.cluster();
  const std::vector<int>& devices = subset.devices;
  const int n = static_cast<int>(devices.size());
  if (options.global_batch < n) return;
  std::vector<Dtype> dtypes;
  for (int id : devices)
    dtypes.push_back(CostModel::trainingDtype(cluster.device(id).type, options.precision));
  const int element = detail::gradElementBytes(dtypes);
  const double params = model.params(0, model.model().layerCount());
  const BucketedAllReduce sync = detail::stageSync(
      model, detail::stageSyncCost(model, devices, element, comm, zero), element, params);
  const auto shards = detail::zeroShards(model, options, devices, zero);
  if (!shards) return;
  const double after_sync =
      detail::groupOptimizerSeconds(model, devices, params, zero, *shards) +
      detail::zeroGatherSeconds(detail::zeroGatherCost(model, devices, comm, zero), params);
  std::map<std::pair<int, int>, RankBest> memo;  // (type id, share)
  auto rankBest = [&](int i, int share) {
    const Device& device = cluster.device(devices[i]);
    auto key = std::make_pair(device.type_id, share);
    auto found = memo.find(key);
    if (found == memo.end())
      found = memo.emplace(key, bestForShare(model, options, device.type, sync, n, zero,
                                             shards->empty() ? 0 : (*shards)[i], share, after_sync))
                  .first;
    return found->second;
  };
  std::vector<int> shares, best_shares;
  double best_step = -1;
  std::function<void(int, int)> enumerate = [&](int i, int left) {
    if (i == n - 1) {
      shares.push_back(left);
      double step = 0;
      bool fits = true;
      for (int r = 0; r < n && fits; ++r) {
        const RankBest choice = rankBest(r, shares[r]);
        fits = choice.cost >= 0;
        step = std::max(step, choice.cost);
      }
      if (fits && (best_step < 0 || step < best_step)) {
        best_step = step;
        best_shares = shares;
      }
      shares.pop_back();
      return;
    }
    for (int b = 1; b <= left - (n - 1 - i); ++b) {
      shares.push_back(b);
      enumerate(i + 1, left - b);
      shares.pop_back();
    }
  };
  enumerate(0, options.global_batch);
  if (best_step < 0) return;
  std::vector<int> micro_batches;
  std::vector<bool> checkpoint;
  for (int r = 0; r < n; ++r) {
    micro_batches.push_back(rankBest(r, best_shares[r]).micro_batch);
    checkpoint.push_back(rankBest(r, best_shares[r]).checkpoint);
  }
  Plan plan = detail::dataParallelPlan(model, options, devices, best_shares, micro_batches,
                                       checkpoint, zero, comm);
  plan.zero_shards = *shards;
  if (detail::price(model, plan)) keep(best, std::move(plan));
}

void pipeline(const CostModel& model, const PlanOptions& options,
              const detail::PipelineShape& shape, int micro_batches, Schedule schedule, int zero,
              const CommPlan& comm, std::optional<Plan>& best) {
  const int layers = model.model().layerCount();
  const int stages = shape.stages();
  std::vector<int> cuts{0};
  std::function<void()> enumerate = [&]() {
    const int s = static_cast<int>(cuts.size()) - 1;
    if (s == stages) {
      if (cuts.back() != layers) return;
      for (int mask = 0; mask < (options.allow_checkpointing ? 1 << stages : 1); ++mask) {
        std::vector<bool> checkpoint;
        for (int k = 0; k < stages; ++k) checkpoint.push_back((mask >> k) & 1);
        Plan plan = detail::pipelinePlan(model, options, shape, cuts, checkpoint, micro_batches,
                                         schedule, zero, comm);
        if (detail::price(model, plan)) keep(best, std::move(plan));
      }
      return;
    }
    for (int j = cuts.back() + 1; j <= layers - (stages - s - 1); ++j) {
      cuts.push_back(j);
      enumerate();
      cuts.pop_back();
    }
  };
  enumerate();
}

}  // namespace

std::optional<Plan> exhaustivePlan(const Cluster& cluster, const ModelProfile& model,
                                   const PlanOptions& options) {
  CHORUS_CHECK_CONFIG(options.global_batch >= 1, "plan: global batch must be >= 1");
  const CostModel cost_model(cluster, model, options.cost);
  std::optional<Plan> best;
  for (const auto& subset : detail::deviceSubsets(cost_model, options)) {
    for (int zero : detail::zeroStages(options))
      for (const CommPlan& comm : detail::commChoices(cluster, subset, options))
        dataParallel(cost_model, options, subset, zero, comm, best);
    if (!options.allow_pipelines) continue;
    for (const auto& shape : detail::pipelineShapes(cluster, subset, model.layerCount(), options))
      detail::forEachEqualPipelineSetting(
          cluster, options, shape,
          [&](int micro_batches, Schedule schedule, int zero, const CommPlan& comm) {
            pipeline(cost_model, options, shape, micro_batches, schedule, zero, comm, best);
          });
  }
  return best;
}

}  // namespace chorus::plan
