// The pruned search: enumerates device subsets, data-parallel configurations and pipeline shapes,
// searches shares or cuts within each (searchers.h), and keeps the best plan per strategy.
#include "chorus/plan/planner.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>

#include "chorus/core/error.h"
#include "search/plan_reasons.h"
#include "search/searchers.h"

namespace chorus::plan {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// The best plan per strategy key, and the k-th best step time for pruning.
class Collector {
 public:
  explicit Collector(int k) : k_(k) {}

  void offer(const std::string& key, Plan plan) {
    auto found = best_.find(key);
    if (found != best_.end() && found->second.predicted.step_seconds <= plan.predicted.step_seconds)
      return;
    best_[key] = std::move(plan);
    threshold_ = computeThreshold();
  }
  // Plans of strategy `key` at or above this step time change nothing: they cannot improve
  // their strategy's best, or cannot enter the top k.
  double bound(const std::string& key) const {
    auto found = best_.find(key);
    return found == best_.end() ? threshold_
                                : std::min(threshold_, found->second.predicted.step_seconds);
  }

  std::vector<Plan> ranked() const {
    std::vector<Plan> plans;
    for (const auto& [key, plan] : best_) plans.push_back(plan);
    std::stable_sort(plans.begin(), plans.end(), [](const Plan& a, const Plan& b) {
      return a.predicted.step_seconds < b.predicted.step_seconds;
    });
    if (static_cast<int>(plans.size()) > k_) plans.resize(k_);
    return plans;
  }

 private:
  double computeThreshold() const {
    if (static_cast<int>(best_.size()) < k_) return kInfinity;
    std::vector<double> steps;
    for (const auto& [key, plan] : best_) steps.push_back(plan.predicted.step_seconds);
    std::nth_element(steps.begin(), steps.begin() + (k_ - 1), steps.end());
    return steps[k_ - 1];
  }

  int k_;
  std::map<std::string, Plan> best_;
  double threshold_ = kInfinity;
};

void checkOptions(const PlanOptions& options, const Cluster& cluster, const ModelProfile& model) {
  CHORUS_CHECK_CONFIG(options.global_batch >= 1, "plan: global batch must be >= 1, got ",
                      options.global_batch);
  CHORUS_CHECK_CONFIG(options.top_k >= 1, "plan: top-k must be >= 1, got ", options.top_k);
  CHORUS_CHECK_CONFIG(options.max_zero_stage >= 0 && options.max_zero_stage <= 3,
                      "plan: max ZeRO stage must be 0..3");
  CHORUS_CHECK_CONFIG(!options.schedules.empty(), "plan: no pipeline schedule allowed");
  CHORUS_CHECK_CONFIG(cluster.size() >= 1, "plan: the cluster has no devices");
  model.validate();
}

// Over a group of several devices: ZeRO-0, whose all-reduce overlaps the backward pass; ZeRO-2,
// whose reduce-scatter carries half that traffic and whose sharded optimizer step is shorter, but
// whose parameter all-gather follows the step; and ZeRO-3. A data-parallel group tries every
// stage (shards sized by memory differ from stage to stage, and the collector keeps the lower of
// two equal times). In a pipeline's stage group (even shards) ZeRO-1 never beats ZeRO-2 (a whole
// all-reduce, the same gather and step, more memory), so the search relabels a ZeRO-2 winner as
// ZeRO-1 only where that fits and costs the same. A group of one device has nothing to shard;
// pipelines' groups shard only with PlanOptions::zero_in_pipelines.
std::vector<int> searchedZeroStages(const PlanOptions& options, int group, bool pipeline) {
  if (group == 1 || (pipeline && !options.zero_in_pipelines)) return {0};
  if (!pipeline) return detail::zeroStages(options);
  std::vector<int> stages{0};
  if (options.max_zero_stage >= 1) stages.push_back(std::min(options.max_zero_stage, 2));
  if (options.max_zero_stage >= 3) stages.push_back(3);
  return stages;
}

Plan relabelZero(const CostModel& model, Plan plan) {
  if (plan.zero_stage != 2 || !plan.zero_shards.empty()) return plan;
  Plan lower = plan;
  lower.zero_stage = 1;
  if (detail::price(model, lower) && lower.predicted.step_seconds <= plan.predicted.step_seconds)
    return lower;
  return plan;
}

void searchSubset(const CostModel& model, const PlanOptions& options,
                  const detail::DeviceSubset& subset, Collector& collector, long long& candidates) {
  const Cluster& cluster = model.cluster();
  for (int zero : searchedZeroStages(options, static_cast<int>(subset.devices.size()), false))
    for (const CommPlan& comm : detail::commChoices(cluster, subset, options)) {
      ++candidates;
      if (auto plan = detail::searchDataParallel(model, options, subset, zero, comm))
        collector.offer(detail::strategyKey(subset, nullptr), std::move(*plan));
    }
  if (!options.allow_pipelines) return;
  for (const auto& shape :
       detail::pipelineShapes(cluster, subset, model.model().layerCount(), options)) {
    const auto comms = detail::commChoices(cluster, shape, options);
    const auto shape_zeros = searchedZeroStages(options, shape.replicas(), true);
    const int share = detail::equalSplit(options.global_batch, shape.replicas()).back();
    const std::string key = detail::strategyKey(subset, &shape);
    // Many micro-batches usually win (small bubble): trying them first tightens the bound early.
    std::vector<int> counts = detail::microBatchCounts(share);
    std::reverse(counts.begin(), counts.end());
    for (int micro_batches : counts) {
      double sum_bound = 0;
      if (detail::pipelineLowerBound(model, options, shape, micro_batches, &sum_bound) >=
          collector.bound(key))
        continue;
      for (Schedule schedule : options.schedules)
        for (int zero : shape_zeros) {
          candidates += static_cast<long long>(comms.size());
          if (auto plan = detail::searchPipeline(model, options, shape, micro_batches, schedule,
                                                 zero, comms, [&] { return collector.bound(key); }))
            collector.offer(key, relabelZero(model, std::move(*plan)));
        }
    }
  }
}

std::optional<Plan> better(std::optional<Plan> a, std::optional<Plan> b) {
  if (!a) return b;
  if (!b) return a;
  return b->predicted.step_seconds < a->predicted.step_seconds ? b : a;
}

// The best plans a homogeneous-minded system would run: equal shares, or equal layer counts per
// stage (fastest-first type order), on the same choice of devices the search has.
void uniformBaselines(const CostModel& model, const PlanOptions& options,
                      const detail::DeviceSubset& all, PlanResult& result) {
  const Cluster& cluster = model.cluster();
  for (int zero : detail::zeroStages(options))
    for (const CommPlan& comm : detail::commChoices(cluster, all, options))
      result.uniform_data_parallel =
          better(result.uniform_data_parallel,
                 detail::searchDataParallel(model, options, all, zero, comm, true));
  if (!options.allow_pipelines) return;
  for (const auto& shape :
       detail::pipelineShapes(cluster, all, model.model().layerCount(), options)) {
    if (shape.type_order != all.type_ids) continue;
    detail::forEachEqualPipelineSetting(
        cluster, options, shape,
        [&](int micro_batches, Schedule schedule, int zero, const CommPlan& comm) {
          result.uniform_pipeline = better(
              result.uniform_pipeline,
              detail::uniformPipeline(model, options, shape, micro_batches, schedule, zero, comm));
        });
  }
}

}  // namespace

double PlanResult::gainOverUniform() const {
  if (plans.empty()) return 0;
  const auto uniform = better(uniform_data_parallel, uniform_pipeline);
  return uniform ? uniform->predicted.step_seconds / plans.front().predicted.step_seconds : 0;
}

PlanResult planCluster(const Cluster& cluster, const ModelProfile& model,
                       const PlanOptions& options) {
  checkOptions(options, cluster, model);
  const auto start = std::chrono::steady_clock::now();
  const CostModel cost_model(cluster, model, options.cost);
  Collector collector(options.top_k);
  PlanResult result;
  result.devices = cluster.size();
  const auto subsets = detail::deviceSubsets(cost_model, options);
  for (const auto& subset : subsets)
    searchSubset(cost_model, options, subset, collector, result.candidates);
  result.plans = collector.ranked();
  for (const auto& subset : subsets) uniformBaselines(cost_model, options, subset, result);
  detail::explainPlans(cost_model, result);
  result.search_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace chorus::plan
