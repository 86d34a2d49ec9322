#include "search/plan_reasons.h"

#include <algorithm>
#include <cstdio>
#include <set>

namespace chorus::plan::detail {
namespace {

std::string format(const char* pattern, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, pattern, value);
  return buffer;
}

// Device types the cluster has that the plan leaves idle, as "the 4 T4s".
std::string idleDevices(const Cluster& cluster, const Plan& plan) {
  std::set<int> used;
  for (const auto& rank : plan.ranks) used.insert(rank.device);
  std::vector<int> idle_per_type(cluster.types().size(), 0);
  for (const Device& device : cluster.devices())
    if (!used.count(device.id)) ++idle_per_type[device.type_id];
  std::string text;
  for (size_t t = 0; t < idle_per_type.size(); ++t) {
    if (idle_per_type[t] == 0) continue;
    const int idle = idle_per_type[t];
    text += (text.empty() ? "" : " and ") +
            (idle > 1 ? "the " + std::to_string(idle) + " " : "the ") + cluster.types()[t].name +
            (idle > 1 ? "s" : "");
  }
  return text;
}

std::string whyBest(const Plan& plan) {
  if (plan.stageCount() == 1) {
    if (plan.replicas.size() == 1) return "one " + plan.ranks[0].device_type + " alone";
    int low = plan.global_batch, high = 0;
    bool one_type = true;
    for (const auto& replica : plan.replicas) {
      low = std::min(low, replica.share);
      high = std::max(high, replica.share);
      one_type =
          one_type && plan.ranks[replica.stages[0].rank].device_type == plan.ranks[0].device_type;
    }
    if (one_type)
      return "data parallelism over " + std::to_string(plan.replicas.size()) + " " +
             plan.ranks[0].device_type + "s with shares as equal as the batch allows";
    if (low == high)
      return "equal shares happen to balance the " + std::to_string(plan.replicas.size()) +
             " devices";
    return "uneven shares (" + std::to_string(high) + ".." + std::to_string(low) +
           " samples) make fast and slow ranks finish together";
  }
  std::string counts;
  for (const auto& stage : plan.replicas[0].stages)
    counts += (counts.empty() ? "" : "/") + std::to_string(stage.last_layer - stage.first_layer);
  return "layer cuts " + counts + " balance the stages, " + std::to_string(plan.micro_batches) +
         (plan.micro_batches == 1 ? " micro-batch holds" : " micro-batches hold") +
         " the bubble at " + format("%.0f%%", 100 * plan.predicted.bubble_fraction);
}

std::string whyWorse(const Plan& plan, const Plan& best) {
  const Prediction& p = plan.predicted;
  const Prediction& b = best.predicted;
  struct Term {
    double delta;
    std::string text;
  };
  const std::vector<Term> terms = {
      {p.compute_seconds - b.compute_seconds,
       "its busiest rank computes " + formatSeconds(p.compute_seconds - b.compute_seconds) +
           " longer"},
      {p.bubble_fraction * p.step_seconds - b.bubble_fraction * b.step_seconds,
       "pipeline bubble of " + format("%.0f%%", 100 * p.bubble_fraction)},
      {p.exposed_comm_seconds - b.exposed_comm_seconds,
       "gradient sync and optimizer leave " + formatSeconds(p.exposed_comm_seconds) + " exposed"},
      {p.p2p_seconds - b.p2p_seconds,
       "stage-to-stage transfers cost " + formatSeconds(p.p2p_seconds)},
  };
  const auto worst = std::max_element(
      terms.begin(), terms.end(), [](const Term& x, const Term& y) { return x.delta < y.delta; });
  const double loss = p.step_seconds / b.step_seconds - 1;
  return format("%.1f%% slower than #1: ", 100 * loss) +
         (worst->delta > 0 ? worst->text : std::string("a mix of small costs"));
}

}  // namespace

std::string formatSeconds(double seconds) {
  if (seconds >= 1) return format("%.2f s", seconds);
  if (seconds >= 1e-3) return format("%.1f ms", seconds * 1e3);
  return format("%.0f us", seconds * 1e6);
}

void explainPlans(const CostModel& model, PlanResult& result) {
  if (result.plans.empty()) return;
  const Cluster& cluster = model.cluster();
  const double gain = result.gainOverUniform();
  for (size_t i = 0; i < result.plans.size(); ++i) {
    Plan& plan = result.plans[i];
    std::string reason = i == 0 ? "best: " + whyBest(plan) : whyWorse(plan, result.plans.front());
    if (i == 0 && gain > 0) reason += format("; %.2fx the best uniform plan", gain);
    bool checkpoints = false;
    for (const auto& replica : plan.replicas)
      for (const auto& stage : replica.stages) checkpoints = checkpoints || stage.checkpoint;
    if (checkpoints) reason += "; recomputes activations to fit memory";
    const std::string idle = idleDevices(cluster, plan);
    if (!idle.empty()) reason += "; leaves " + idle + " idle";
    plan.reason = reason;
  }
}

}  // namespace chorus::plan::detail
