// CostModel::evaluate: the predicted step time and memory of a whole plan.
#include <algorithm>
#include <cmath>

#include "chorus/core/error.h"
#include "chorus/plan/cost_model.h"
#include "cost/step_terms.h"

namespace chorus::plan {
namespace detail {

int gradElementBytes(const std::vector<Dtype>& dtypes) {
  for (Dtype dtype : dtypes)
    if (bytesOf(dtype) == 4 || dtype != dtypes.front()) return 4;
  return 2;
}

LinearCost stageSyncCost(const CostModel& model, const std::vector<int>& devices, int element_bytes,
                         const CommPlan& comm, int zero_stage) {
  LinearCost cost = gradientAllReduceCost(model.cluster(), devices, comm.algorithm, comm.codec.kind,
                                          element_bytes, model.options().codec_seconds_per_byte);
  const double traffic = zero_stage == 2 ? 0.5 : zero_stage >= 3 ? 1.5 : 1;
  cost.latency *= traffic;
  cost.per_byte *= traffic;
  return cost;
}

LinearCost zeroGatherCost(const CostModel& model, const std::vector<int>& devices,
                          const CommPlan& comm, int zero_stage) {
  if (zero_stage < 1 || zero_stage > 2 || devices.size() < 2) return {};
  return gradientAllReduceCost(model.cluster(), devices, comm.algorithm, CodecKind::kNone, 4);
}

std::optional<std::vector<double>> zeroShards(const CostModel& model, const PlanOptions& options,
                                              const std::vector<int>& devices, int zero_stage) {
  const int n = static_cast<int>(devices.size());
  if (zero_stage == 0 || n < 2 || options.zero_shards == ZeroShards::kEven)
    return std::vector<double>{};
  const int layers = model.model().layerCount();
  std::vector<StageMemoryRequest> requests;
  std::vector<double> usable;
  for (int id : devices) {
    const DeviceType& type = model.cluster().device(id).type;
    requests.push_back(
        zeroShardRequest(layers, CostModel::trainingDtype(type, options.precision), zero_stage, n));
    usable.push_back(model.capacity(type));
  }
  return fitZeroShardsByMemory(model.memory(), std::move(requests), usable);
}

double groupOptimizerSeconds(const CostModel& model, const std::vector<int>& devices, double params,
                             int zero_stage, const std::vector<double>& shards) {
  const int n = static_cast<int>(devices.size());
  double slowest = 0;
  for (int i = 0; i < n; ++i) {
    const DeviceType& type = model.cluster().device(devices[i]).type;
    const double seconds = !shards.empty()
                               ? model.optimizerSeconds(type, params * shards[i], 1)
                               : model.optimizerSeconds(type, params, zero_stage >= 1 ? n : 1);
    slowest = std::max(slowest, seconds);
  }
  return slowest;
}

double accumulateSeconds(const CostModel& model, const DeviceType& type, Dtype dtype, double speed,
                         int layers, int share, int micro_batch, bool checkpoint,
                         double* backward_last) {
  const int count = (share + micro_batch - 1) / micro_batch;
  const int last = share - (count - 1) * micro_batch;
  const double full =
      model.microBatchSeconds(type, dtype, 0, layers, micro_batch, checkpoint) / speed;
  const double tail = model.microBatchSeconds(type, dtype, 0, layers, last, checkpoint) / speed;
  *backward_last = tail - model.forwardSeconds(type, dtype, 0, layers, last) / speed;
  return (count - 1) * full + tail;
}

void addDistinct(std::vector<LinearCost>& costs, const LinearCost& cost) {
  for (const LinearCost& known : costs)
    if (known.latency == cost.latency && known.per_byte == cost.per_byte) return;
  costs.push_back(cost);
}

int inFlight(Schedule schedule, int stage, int stages, int micro_batches) {
  return schedule == Schedule::kGpipe ? micro_batches : std::min(stages - stage, micro_batches);
}

}  // namespace detail

namespace {

struct RankView {
  const DeviceType* type;
  Dtype dtype;
  double speed;
  double capacity;
};

std::vector<RankView> viewRanks(const CostModel& model, const Plan& plan) {
  std::vector<RankView> views;
  for (size_t i = 0; i < plan.ranks.size(); ++i) {
    const RankPlan& rank = plan.ranks[i];
    CHORUS_CHECK_CONFIG(rank.device >= 0 && rank.device < model.cluster().size(), "plan rank ", i,
                        " names device ", rank.device, " of ", model.cluster().size());
    const DeviceType& type = model.cluster().device(rank.device).type;
    CHORUS_CHECK_CONFIG(type.supports(rank.precision), "plan rank ", i, ": ", type.name,
                        " has no fast path for ", toString(rank.precision));
    double capacity = model.capacity(type);
    if (rank.memory_budget > 0)
      capacity = std::min(capacity, static_cast<double>(rank.memory_budget));
    views.push_back({&type, rank.precision, rank.emulated_speed, capacity});
  }
  return views;
}

}  // namespace

PlanCost CostModel::evaluate(const Plan& plan) const {
  plan.validate(model_.layerCount());
  const std::vector<RankView> ranks = viewRanks(*this, plan);
  const int stages = plan.stageCount();
  const int replicas = static_cast<int>(plan.replicas.size());
  const int zero = plan.zero_stage;
  PlanCost cost;
  cost.memory = rankMemory(memory_, plan);
  cost.capacity.assign(ranks.size(), 0);
  cost.compute.assign(ranks.size(), 0);
  // Per stage: its data-parallel group's synchronization.
  std::vector<BucketedAllReduce> sync(stages);
  for (int s = 0; s < stages; ++s) {
    std::vector<int> devices;
    std::vector<Dtype> dtypes;
    for (const auto& replica : plan.replicas) {
      devices.push_back(plan.ranks[replica.stages[s].rank].device);
      dtypes.push_back(ranks[replica.stages[s].rank].dtype);
    }
    const StagePlan& stage = plan.replicas[0].stages[s];
    const int element = detail::gradElementBytes(dtypes);
    sync[s] =
        detail::stageSync(*this, detail::stageSyncCost(*this, devices, element, plan.comm, zero),
                          element, params(stage.first_layer, stage.last_layer));
  }
  // Per stage boundary: the distinct links the replicas cross there.
  std::vector<std::vector<LinearCost>> links(stages);
  for (int s = 0; s + 1 < stages; ++s)
    for (const auto& replica : plan.replicas)
      detail::addDistinct(links[s], p2pCost(cluster_, plan.ranks[replica.stages[s].rank].device,
                                            plan.ranks[replica.stages[s + 1].rank].device));
  double step = -1;
  int critical = 0;
  std::vector<double> replica_p2p(replicas, 0), replica_tail(replicas, 0),
      replica_bubble(replicas, 0);
  std::vector<double> replica_opt(replicas, 0);
  // Per stage: the optimizer step of its slowest member, which follows the group's reduction,
  // and ZeRO-1/2's all-gather of the parameters after it.
  std::vector<double> optimizer(stages, 0), gather(stages, 0);
  for (int s = 0; s < stages; ++s) {
    const StagePlan& stage = plan.replicas[0].stages[s];
    std::vector<int> devices;
    std::vector<double> shards;
    for (const auto& replica : plan.replicas) {
      const int rank = replica.stages[s].rank;
      devices.push_back(plan.ranks[rank].device);
      if (!plan.zero_shards.empty()) shards.push_back(plan.zero_shards[rank]);
    }
    const double stage_params = params(stage.first_layer, stage.last_layer);
    optimizer[s] = detail::groupOptimizerSeconds(*this, devices, stage_params, zero, shards);
    gather[s] = detail::zeroGatherSeconds(detail::zeroGatherCost(*this, devices, plan.comm, zero),
                                          stage_params);
  }
  for (int r = 0; r < replicas; ++r) {
    const ReplicaPlan& replica = plan.replicas[r];
    double pipeline = 0, slowest = 0, sum = 0, busy = 0, tail = 0, p2p_total = 0, opt_max = 0;
    for (int s = 0; s < stages; ++s) {
      const StagePlan& stage = replica.stages[s];
      const RankView& rank = ranks[stage.rank];
      opt_max = std::max(opt_max, optimizer[s]);
      cost.capacity[stage.rank] = rank.capacity;
      if (stages == 1) {
        double backward = 0;
        busy = detail::accumulateSeconds(*this, *rank.type, rank.dtype, rank.speed,
                                         model_.layerCount(), replica.share, stage.micro_batch,
                                         stage.checkpoint, &backward);
        cost.compute[stage.rank] = busy;
        pipeline = detail::hostSeconds(*this, replica.share) + busy;
        tail = detail::tailSeconds(sync[0], backward, optimizer[0] + gather[0]);
        continue;
      }
      const double compute =
          microBatchSeconds(*rank.type, rank.dtype, stage.first_layer, stage.last_layer,
                            stage.micro_batch, stage.checkpoint) /
          rank.speed;
      const double forward = forwardSeconds(*rank.type, rank.dtype, stage.first_layer,
                                            stage.last_layer, stage.micro_batch) /
                             rank.speed;
      double p2p = 0;
      if (s + 1 < stages) {
        // Replicas move in step: every one pays the slowest link at this boundary.
        const double bytes = boundaryBytes(rank.dtype, stage.last_layer, stage.micro_batch);
        for (const LinearCost& link : links[s]) p2p = std::max(p2p, link.seconds(bytes));
      }
      const double t = compute + 2 * p2p;
      sum += t;
      slowest = std::max(slowest, t);
      p2p_total += 2 * p2p;
      busy = std::max(busy, compute * plan.micro_batches);
      cost.compute[stage.rank] = compute * plan.micro_batches;
      tail =
          std::max(tail, detail::tailSeconds(sync[s], compute - forward, optimizer[s] + gather[s]));
    }
    if (stages > 1) {
      pipeline =
          detail::hostSeconds(*this, replica.share) + sum + (plan.micro_batches - 1) * slowest;
      double work = 0;
      for (const auto& stage : replica.stages) work += cost.compute[stage.rank];
      replica_bubble[r] = 1 - work / (stages * pipeline);
      replica_p2p[r] = p2p_total * plan.micro_batches;
    }
    replica_tail[r] = tail;
    replica_opt[r] = opt_max;
    if (pipeline + tail > step) {
      step = pipeline + tail;
      critical = r;
      cost.prediction.compute_seconds = busy;
    }
  }
  Prediction& p = cost.prediction;
  step += options_.step_overhead_seconds;
  p.step_seconds = step;
  p.samples_per_second = plan.global_batch / step;
  p.bubble_fraction = replica_bubble[critical];
  p.p2p_seconds = replica_p2p[critical];
  p.exposed_comm_seconds = replica_tail[critical];
  p.optimizer_seconds = replica_opt[critical];
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (cost.memory[i] <= cost.capacity[i]) continue;
    cost.feasible = false;
    cost.infeasible_reason = "rank " + std::to_string(i) + " (" + ranks[i].type->name + ") needs " +
                             std::to_string(cost.memory[i] / (1 << 30)) + " GiB of " +
                             std::to_string(cost.capacity[i] / (1 << 30)) + " GiB usable";
    break;
  }
  return cost;
}

}  // namespace chorus::plan
