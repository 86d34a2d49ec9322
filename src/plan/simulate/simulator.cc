// Builds the task graph of one step of a plan and runs it on the event engine.
#include "chorus/plan/simulator.h"

#include <algorithm>
#include <unordered_map>

#include "cost/step_terms.h"
#include "search/search_space.h"
#include "simulate/sim_engine.h"

namespace chorus::plan {
namespace {

class StepGraph {
 public:
  StepGraph(const CostModel& model, const Plan& plan) : model_(model), plan_(plan) {
    const int replicas = static_cast<int>(plan.replicas.size());
    forward_.resize(replicas);
    backward_.resize(replicas);
    order_.resize(plan.ranks.size());
  }

  void build() {
    for (size_t r = 0; r < plan_.replicas.size(); ++r) {
      computeTasks(static_cast<int>(r));
      transfers(static_cast<int>(r));
    }
    for (size_t rank = 0; rank < order_.size(); ++rank)
      for (size_t k = 1; k < order_[rank].size(); ++k)
        engine_.depend(order_[rank][k], order_[rank][k - 1]);
    for (int s = 0; s < plan_.stageCount(); ++s) syncAndOptimizer(s);
  }

  SimResult run(bool trace) {
    const Cluster& cluster = model_.cluster();
    engine_.run(cluster.size() + static_cast<int>(cluster.nodes().size()));
    SimResult result;
    result.tasks = engine_.size();
    result.ranks.resize(plan_.ranks.size());
    double compute_end = 0;
    for (int id = 0; id < engine_.size(); ++id) {
      const detail::SimTask& task = engine_.task(id);
      result.step_seconds = std::max(result.step_seconds, task.end);
      if (task.category == "compute") {
        result.ranks[task.rank].busy += task.duration;
        compute_end = std::max(compute_end, task.end);
      }
      if (task.category == "compute" || task.category == "optimizer")
        result.ranks[task.rank].finish = std::max(result.ranks[task.rank].finish, task.end);
      if (task.category == "allgather")
        for (int rank : membersOf(id))
          result.ranks[rank].finish = std::max(result.ranks[rank].finish, task.end);
      if (!trace) continue;
      for (int rank : membersOf(id))
        result.spans.push_back({task.name, task.category, rank, task.start, task.duration});
    }
    // The host's own per-step work (data, bookkeeping) runs after the step's tasks.
    result.step_seconds += model_.options().step_overhead_seconds;
    double busy = 0;
    for (RankActivity& rank : result.ranks) {
      rank.utilization = rank.busy / result.step_seconds;
      rank.bubble = 1 - rank.busy / compute_end;
      busy += rank.busy;
    }
    result.bubble_fraction = 1 - busy / (result.ranks.size() * compute_end);
    return result;
  }

 private:
  std::vector<int> sizesOf(const ReplicaPlan& replica) const {
    if (plan_.stageCount() > 1) return detail::equalSplit(replica.share, plan_.micro_batches);
    const int mb = replica.stages[0].micro_batch;
    std::vector<int> sizes((replica.share + mb - 1) / mb, mb);
    sizes.back() = replica.share - (static_cast<int>(sizes.size()) - 1) * mb;
    return sizes;
  }

  const DeviceType& typeOf(int rank) const {
    return model_.cluster().device(plan_.ranks[rank].device).type;
  }

  void computeTasks(int r) {
    const ReplicaPlan& replica = plan_.replicas[r];
    const std::vector<int> sizes = sizesOf(replica);
    const int stages = plan_.stageCount();
    for (int s = 0; s < stages; ++s) {
      const StagePlan& stage = replica.stages[s];
      const RankPlan& rank = plan_.ranks[stage.rank];
      std::vector<int> forward, backward;
      for (size_t m = 0; m < sizes.size(); ++m) {
        const double f = model_.forwardSeconds(typeOf(stage.rank), rank.precision,
                                               stage.first_layer, stage.last_layer, sizes[m]) /
                         rank.emulated_speed;
        const double all =
            model_.microBatchSeconds(typeOf(stage.rank), rank.precision, stage.first_layer,
                                     stage.last_layer, sizes[m], stage.checkpoint) /
            rank.emulated_speed;
        forward.push_back(engine_.add({"F" + std::to_string(m), "compute", stage.rank, f, {}}));
        backward.push_back(
            engine_.add({"B" + std::to_string(m), "compute", stage.rank, all - f, {}}));
      }
      order_[stage.rank] = scheduleOrder(forward, backward, s, stages);
      const double host = detail::hostSeconds(model_, replica.share);
      if (s == 0 && host > 0 && !order_[stage.rank].empty()) {
        // Loading the replica's samples precedes its first forward.
        const int data = engine_.add({"data", "host", stage.rank, host, {}});
        engine_.depend(order_[stage.rank].front(), data);
      }
      forward_[r].push_back(std::move(forward));
      backward_[r].push_back(std::move(backward));
    }
  }

  std::vector<int> scheduleOrder(const std::vector<int>& forward, const std::vector<int>& backward,
                                 int stage, int stages) const {
    const int count = static_cast<int>(forward.size());
    std::vector<int> order;
    if (stages == 1) {
      for (int m = 0; m < count; ++m) order.insert(order.end(), {forward[m], backward[m]});
    } else if (plan_.schedule == Schedule::kGpipe) {
      order = forward;
      order.insert(order.end(), backward.begin(), backward.end());
    } else {
      const int warmup = std::min(stages - stage - 1, count);
      for (int m = 0; m < warmup; ++m) order.push_back(forward[m]);
      for (int m = 0; m + warmup < count; ++m)
        order.insert(order.end(), {forward[m + warmup], backward[m]});
      for (int m = count - warmup; m < count; ++m) order.push_back(backward[m]);
    }
    return order;
  }

  // Resource ids: a device's intra-node port is its id; a node's network is devices + node.
  std::vector<int> egress(int from, int to) const {
    const Cluster& cluster = model_.cluster();
    if (cluster.sameNode(from, to)) return {from};
    return {cluster.size() + cluster.device(from).node};
  }

  void transfers(int r) {
    const ReplicaPlan& replica = plan_.replicas[r];
    const std::vector<int> sizes = sizesOf(replica);
    for (int s = 0; s + 1 < plan_.stageCount(); ++s) {
      const StagePlan& stage = replica.stages[s];
      const int from = plan_.ranks[stage.rank].device,
                to = plan_.ranks[replica.stages[s + 1].rank].device;
      const LinearCost link = p2pCost(model_.cluster(), from, to);
      for (size_t m = 0; m < sizes.size(); ++m) {
        const double seconds = link.seconds(
            model_.boundaryBytes(plan_.ranks[stage.rank].precision, stage.last_layer, sizes[m]));
        const std::string tag =
            std::to_string(s) + "->" + std::to_string(s + 1) + " #" + std::to_string(m);
        const int act = engine_.add({"act " + tag, "p2p", stage.rank, seconds, egress(from, to)});
        engine_.depend(act, forward_[r][s][m]);
        engine_.depend(forward_[r][s + 1][m], act);
        const int grad = engine_.add(
            {"grad " + tag, "p2p", replica.stages[s + 1].rank, seconds, egress(to, from)});
        engine_.depend(grad, backward_[r][s + 1][m]);
        engine_.depend(backward_[r][s][m], grad);
      }
    }
  }

  void syncAndOptimizer(int s) {
    const Cluster& cluster = model_.cluster();
    std::vector<int> devices, ranks, resources;
    std::vector<Dtype> dtypes;
    for (const auto& replica : plan_.replicas) {
      const int rank = replica.stages[s].rank;
      ranks.push_back(rank);
      devices.push_back(plan_.ranks[rank].device);
      dtypes.push_back(plan_.ranks[rank].precision);
      resources.push_back(devices.back());
    }
    const StagePlan& stage = plan_.replicas[0].stages[s];
    const double params = model_.params(stage.first_layer, stage.last_layer);
    const int element = detail::gradElementBytes(dtypes);
    const LinearCost cost =
        detail::stageSyncCost(model_, devices, element, plan_.comm, plan_.zero_stage);
    const BucketedAllReduce sync = detail::stageSync(model_, cost, element, params);
    for (int id : devices)
      if (!cluster.sameNode(id, devices.front())) {
        for (int d : devices) resources.push_back(cluster.size() + cluster.device(d).node);
        break;
      }
    std::sort(resources.begin(), resources.end());
    resources.erase(std::unique(resources.begin(), resources.end()), resources.end());
    int previous = -1;
    for (int k = 0; k < sync.buckets; ++k) {
      const double seconds = cost.seconds(params * element / sync.buckets);
      const int bucket =
          engine_.add({"allreduce s" + std::to_string(s) + " " + std::to_string(k + 1) + "/" +
                           std::to_string(sync.buckets),
                       "allreduce", ranks.front(), seconds, resources});
      members_[bucket] = ranks;
      for (int rank : ranks) engine_.depend(bucket, order_[rank].back(), (k + 1.0) / sync.buckets);
      if (previous >= 0) engine_.depend(bucket, previous);
      previous = bucket;
    }
    const double shard = plan_.zero_stage >= 1 ? plan_.replicas.size() : 1;
    std::vector<int> steps;
    for (int rank : ranks) {
      const double seconds =
          plan_.zero_shards.empty()
              ? model_.optimizerSeconds(typeOf(rank), params, shard)
              : model_.optimizerSeconds(typeOf(rank), params * plan_.zero_shards[rank], 1);
      const int step = engine_.add({"optimizer", "optimizer", rank, seconds, {}});
      engine_.depend(step, order_[rank].back());
      if (previous >= 0) engine_.depend(step, previous);
      steps.push_back(step);
    }
    // ZeRO-1/2 all-gather the updated parameters once every member has stepped its slice.
    const double gather = detail::zeroGatherSeconds(
        detail::zeroGatherCost(model_, devices, plan_.comm, plan_.zero_stage), params);
    if (gather <= 0) return;
    const int all_gather = engine_.add(
        {"allgather s" + std::to_string(s), "allgather", ranks.front(), gather, resources});
    members_[all_gather] = ranks;
    for (int step : steps) engine_.depend(all_gather, step);
  }

  std::vector<int> membersOf(int id) const {
    const auto found = members_.find(id);
    return found == members_.end() ? std::vector<int>{engine_.task(id).rank} : found->second;
  }

  const CostModel& model_;
  const Plan& plan_;
  detail::SimEngine engine_;
  std::vector<std::vector<std::vector<int>>> forward_, backward_;  // [replica][stage][micro-batch]
  std::vector<std::vector<int>> order_;                            // per rank, compute in order
  std::unordered_map<int, std::vector<int>> members_;              // collective -> its ranks
};

}  // namespace

SimResult simulate(const CostModel& model, const Plan& plan, const SimOptions& options) {
  model.evaluate(plan);  // validates the plan against the model and cluster
  StepGraph graph(model, plan);
  graph.build();
  return graph.run(options.trace);
}

}  // namespace chorus::plan
