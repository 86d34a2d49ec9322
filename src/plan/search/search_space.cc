#include "search/search_space.h"

#include <algorithm>
#include <numeric>

namespace chorus::plan::detail {
namespace {

constexpr size_t kMaxPermutedTypes = 5;
// Longer pipelines try only a few type orders: each type then holds many stages, so the order
// matters mostly through 1F1B's in-flight activations on the first stages.
constexpr int kMaxPermutedStages = 12;

double typeSpeed(const CostModel& model, const DeviceType& type, PrecisionPolicy policy) {
  const Dtype dtype = CostModel::trainingDtype(type, policy);
  return type.peak(dtype) * model.efficiency(type, dtype);
}

// Orders of the kept types (fastest first in `types`) along a pipeline of `stages` stages.
std::vector<std::vector<int>> typeOrders(const Cluster& cluster, const std::vector<int>& types,
                                         int stages) {
  std::vector<std::vector<int>> orders;
  if (types.size() > kMaxPermutedTypes || stages > kMaxPermutedStages) {
    auto add = [&](std::vector<int> order) {
      if (std::find(orders.begin(), orders.end(), order) == orders.end()) orders.push_back(order);
    };
    add(types);
    add({types.rbegin(), types.rend()});
    std::vector<int> by_memory = types;
    std::stable_sort(by_memory.begin(), by_memory.end(), [&](int a, int b) {
      return cluster.types()[a].memory_bytes > cluster.types()[b].memory_bytes;
    });
    add(by_memory);
    return orders;
  }
  std::vector<int> order = types;
  std::sort(order.begin(), order.end());
  do {
    orders.push_back(order);
  } while (std::next_permutation(order.begin(), order.end()));
  // Fastest-first first, so that ties go to the conventional order.
  std::stable_partition(orders.begin(), orders.end(),
                        [&](const std::vector<int>& o) { return o == types; });
  return orders;
}

std::vector<std::vector<int>> arrange(const Cluster& cluster, const std::vector<int>& devices,
                                      const std::vector<int>& order, int replicas, bool strided) {
  std::vector<std::vector<int>> grid(replicas);
  for (int type : order) {
    std::vector<int> of_type;
    for (int id : devices)
      if (cluster.device(id).type_id == type) of_type.push_back(id);
    const int per_replica = static_cast<int>(of_type.size()) / replicas;
    for (int r = 0; r < replicas; ++r)
      for (int q = 0; q < per_replica; ++q)
        grid[r].push_back(strided ? of_type[q * replicas + r] : of_type[r * per_replica + q]);
  }
  return grid;
}

}  // namespace

std::vector<DeviceSubset> deviceSubsets(const CostModel& model, const PlanOptions& options) {
  const Cluster& cluster = model.cluster();
  std::vector<int> types(cluster.types().size());
  std::iota(types.begin(), types.end(), 0);
  std::stable_sort(types.begin(), types.end(), [&](int a, int b) {
    return typeSpeed(model, cluster.types()[a], options.precision) >
           typeSpeed(model, cluster.types()[b], options.precision);
  });
  std::vector<DeviceSubset> subsets;
  const size_t smallest = options.allow_dropping_devices ? 1 : types.size();
  for (size_t kept = types.size(); kept >= smallest && kept > 0; --kept) {
    DeviceSubset subset;
    subset.type_ids.assign(types.begin(), types.begin() + kept);
    subset.dropped.assign(types.begin() + kept, types.end());
    for (const Device& device : cluster.devices())
      if (std::find(subset.type_ids.begin(), subset.type_ids.end(), device.type_id) !=
          subset.type_ids.end())
        subset.devices.push_back(device.id);
    subsets.push_back(std::move(subset));
  }
  return subsets;
}

std::vector<CommPlan> commChoices(bool crosses_nodes, const PlanOptions& options) {
  std::vector<CommPlan> choices{CommPlan{}};
  if (!crosses_nodes) return choices;
  CommPlan hierarchical;
  hierarchical.algorithm = AllReduceAlgorithm::kHierarchical;
  choices.push_back(hierarchical);
  if (options.allow_compression) {
    for (CodecKind codec : {CodecKind::kFp16, CodecKind::kInt8})
      for (AllReduceAlgorithm algo :
           {AllReduceAlgorithm::kFlat, AllReduceAlgorithm::kHierarchical}) {
        CommPlan compressed;
        compressed.algorithm = algo;
        compressed.codec.kind = codec;
        choices.push_back(compressed);
      }
  }
  return choices;
}

std::vector<CommPlan> commChoices(const Cluster& cluster, const DeviceSubset& subset,
                                  const PlanOptions& options) {
  bool crosses_nodes = false;
  for (int id : subset.devices) crosses_nodes |= !cluster.sameNode(id, subset.devices.front());
  return commChoices(crosses_nodes, options);
}

std::vector<CommPlan> commChoices(const Cluster& cluster, const PipelineShape& shape,
                                  const PlanOptions& options) {
  if (shape.replicas() == 1) return {CommPlan{}};
  return commChoices(shape.groupsCrossNodes(cluster), options);
}

bool PipelineShape::groupsCrossNodes(const Cluster& cluster) const {
  for (int s = 0; s < stages(); ++s)
    for (int r = 1; r < replicas(); ++r)
      if (!cluster.sameNode(devices[0][s], devices[r][s])) return true;
  return false;
}

std::vector<PipelineShape> pipelineShapes(const Cluster& cluster, const DeviceSubset& subset,
                                          int layers, const PlanOptions& options) {
  int divisor = 0;
  for (int type : subset.type_ids) {
    int count = 0;
    for (int id : subset.devices) count += cluster.device(id).type_id == type;
    divisor = std::gcd(divisor, count);
  }
  const int n = static_cast<int>(subset.devices.size());
  const int max_stages = options.max_stages > 0 ? std::min(options.max_stages, layers) : layers;
  std::vector<PipelineShape> shapes;
  for (int replicas = 1; replicas <= divisor; ++replicas) {
    if (divisor % replicas != 0 || replicas > options.global_batch) continue;
    const int stages = n / replicas;
    if (stages < 2 || stages > max_stages) continue;
    for (const auto& order : typeOrders(cluster, subset.type_ids, stages)) {
      PipelineShape packed{arrange(cluster, subset.devices, order, replicas, false), order, false};
      PipelineShape strided{arrange(cluster, subset.devices, order, replicas, true), order, true};
      const bool differ = packed.devices != strided.devices;
      shapes.push_back(std::move(packed));
      if (differ) shapes.push_back(std::move(strided));
    }
  }
  return shapes;
}

std::vector<int> microBatchCounts(int share) {
  std::vector<int> counts;
  for (int m = 1; m < share; m *= 2) counts.push_back(m);
  counts.push_back(share);
  return counts;
}

std::vector<int> equalSplit(int total, int parts) {
  std::vector<int> shares(parts, total / parts);
  for (int i = 0; i < total % parts; ++i) ++shares[i];
  return shares;
}

std::vector<int> zeroStages(const PlanOptions& options) {
  std::vector<int> stages;
  for (int z = 0; z <= options.max_zero_stage; ++z) stages.push_back(z);
  return stages;
}

std::vector<int> pipelineZeroStages(const PlanOptions& options) {
  return options.zero_in_pipelines ? zeroStages(options) : std::vector<int>{0};
}

namespace {

RankPlan rankFor(const CostModel& model, const PlanOptions& options, int device_id) {
  const Device& device = model.cluster().device(device_id);
  RankPlan rank;
  rank.device = device_id;
  rank.device_type = device.type.name;
  rank.node = model.cluster().nodes()[device.node].name;
  rank.precision = CostModel::trainingDtype(device.type, options.precision);
  return rank;
}

Plan emptyPlan(const CostModel& model, const PlanOptions& options, int zero_stage,
               const CommPlan& comm) {
  Plan plan;
  plan.model = model.model().name;
  plan.global_batch = options.global_batch;
  plan.seed = options.seed;
  plan.zero_stage = zero_stage;
  plan.comm = comm;
  plan.comm.codec.seed = plan.seed;
  return plan;
}

}  // namespace

Plan dataParallelPlan(const CostModel& model, const PlanOptions& options,
                      const std::vector<int>& devices, const std::vector<int>& shares,
                      const std::vector<int>& micro_batches, const std::vector<bool>& checkpoint,
                      int zero_stage, const CommPlan& comm) {
  Plan plan = emptyPlan(model, options, zero_stage, comm);
  for (size_t i = 0; i < devices.size(); ++i) {
    plan.ranks.push_back(rankFor(model, options, devices[i]));
    StagePlan stage{0, model.model().layerCount(), static_cast<int>(i), micro_batches[i],
                    checkpoint[i]};
    plan.replicas.push_back({shares[i], {stage}});
  }
  return plan;
}

Plan pipelinePlan(const CostModel& model, const PlanOptions& options, const PipelineShape& shape,
                  const std::vector<int>& cuts, const std::vector<bool>& checkpoint,
                  int micro_batches, Schedule schedule, int zero_stage, const CommPlan& comm) {
  Plan plan = emptyPlan(model, options, zero_stage, comm);
  plan.micro_batches = micro_batches;
  plan.schedule = schedule;
  const std::vector<int> shares = equalSplit(options.global_batch, shape.replicas());
  for (int r = 0; r < shape.replicas(); ++r) {
    ReplicaPlan replica;
    replica.share = shares[r];
    for (int s = 0; s < shape.stages(); ++s) {
      const int rank = static_cast<int>(plan.ranks.size());
      plan.ranks.push_back(rankFor(model, options, shape.devices[r][s]));
      replica.stages.push_back({cuts[s], cuts[s + 1], rank,
                                (shares[r] + micro_batches - 1) / micro_batches, checkpoint[s]});
    }
    plan.replicas.push_back(std::move(replica));
  }
  return plan;
}

bool price(const CostModel& model, Plan& plan) {
  const PlanCost cost = model.evaluate(plan);
  plan.predicted = cost.prediction;
  for (size_t i = 0; i < plan.ranks.size(); ++i)
    plan.ranks[i].predicted_memory = static_cast<std::uint64_t>(cost.memory[i]);
  return cost.feasible;
}

std::string strategyKey(const DeviceSubset& subset, const PipelineShape* shape) {
  std::string key = "kept" + std::to_string(subset.type_ids.size());
  if (!shape) return key + "/dp";
  return key + "/pp" + std::to_string(shape->replicas()) + "x" + std::to_string(shape->stages());
}

}  // namespace chorus::plan::detail
