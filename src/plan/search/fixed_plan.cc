#include "chorus/plan/fixed_plan.h"

#include <numeric>

#include "chorus/core/error.h"
#include "search/search_space.h"

namespace chorus::plan {
namespace {

std::vector<int> allDevices(const Cluster& cluster) {
  std::vector<int> devices(static_cast<size_t>(cluster.size()));
  std::iota(devices.begin(), devices.end(), 0);
  return devices;
}

// Prices `plan` and says why it is what it is.
Plan priced(const CostModel& model, Plan plan) {
  const PlanCost cost = model.evaluate(plan);
  plan.predicted = cost.prediction;
  for (size_t i = 0; i < plan.ranks.size(); ++i)
    plan.ranks[i].predicted_memory = static_cast<std::uint64_t>(cost.memory[i]);
  plan.reason = cost.feasible ? "fixed by hand" : "fixed by hand; " + cost.infeasible_reason;
  return plan;
}

}  // namespace

Plan fixedDataParallelPlan(const CostModel& model, const std::vector<int>& shares, int micro_batch,
                           PrecisionPolicy precision) {
  const Cluster& cluster = model.cluster();
  CHORUS_CHECK_CONFIG(static_cast<int>(shares.size()) == cluster.size(), "got ", shares.size(),
                      " shares for ", cluster.size(), " devices; give one per device");
  CHORUS_CHECK_CONFIG(micro_batch >= 0, "micro-batch must be >= 0, got ", micro_batch);
  PlanOptions options;
  options.precision = precision;
  options.global_batch = 0;
  std::vector<int> micro_batches;
  for (size_t i = 0; i < shares.size(); ++i) {
    CHORUS_CHECK_CONFIG(shares[i] >= 1, "share ", i, " must be >= 1, got ", shares[i]);
    options.global_batch += shares[i];
    micro_batches.push_back(micro_batch > 0 ? std::min(micro_batch, shares[i]) : shares[i]);
  }
  const std::vector<bool> checkpoint(shares.size(), false);
  return priced(model, detail::dataParallelPlan(model, options, allDevices(cluster), shares,
                                                micro_batches, checkpoint, 0, CommPlan{}));
}

Plan fixedPipelinePlan(const CostModel& model, const std::vector<int>& cuts, int global_batch,
                       int micro_batches, Schedule schedule, PrecisionPolicy precision) {
  const Cluster& cluster = model.cluster();
  const int layers = model.model().layerCount();
  CHORUS_CHECK_CONFIG(static_cast<int>(cuts.size()) == cluster.size() + 1, "got ", cuts.size(),
                      " cuts for ", cluster.size(), " stages; give stages + 1 (from 0 to ", layers,
                      ")");
  CHORUS_CHECK_CONFIG(cuts.front() == 0 && cuts.back() == layers, "cuts must run from 0 to ",
                      layers);
  for (size_t s = 0; s + 1 < cuts.size(); ++s)
    CHORUS_CHECK_CONFIG(cuts[s] < cuts[s + 1], "cuts must increase strictly");
  CHORUS_CHECK_CONFIG(micro_batches >= 1 && micro_batches <= global_batch,
                      "micro-batches must be in [1, ", global_batch, "], got ", micro_batches);
  PlanOptions options;
  options.precision = precision;
  options.global_batch = global_batch;
  detail::PipelineShape shape;
  shape.devices = {allDevices(cluster)};
  const std::vector<bool> checkpoint(static_cast<size_t>(cluster.size()), false);
  return priced(model, detail::pipelinePlan(model, options, shape, cuts, checkpoint, micro_batches,
                                            schedule, 0, CommPlan{}));
}

}  // namespace chorus::plan
