#include "chorus/plan/comm_cost.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "chorus/core/error.h"

namespace chorus::plan {
namespace {

// Devices of `group` counted per node, and the slowest intra-node link among them.
struct GroupShape {
  std::map<int, int> per_node;  // node index -> devices of the group on it
  double intra_bandwidth = 0;   // slowest effective intra-node bandwidth (0 if no node has two)
  double intra_latency = 0;
  double network_bandwidth = 0;  // slowest node network bandwidth among spanned nodes
  double network_latency = 0;
};

GroupShape shapeOf(const Cluster& cluster, const std::vector<int>& group) {
  GroupShape shape;
  for (int id : group) ++shape.per_node[cluster.device(id).node];
  for (const auto& [node_index, count] : shape.per_node) {
    const Node& node = cluster.nodes()[node_index];
    if (count > 1) {
      const double bandwidth = node.intra_link.effectiveBandwidth();
      shape.intra_bandwidth =
          shape.intra_bandwidth == 0 ? bandwidth : std::min(shape.intra_bandwidth, bandwidth);
      shape.intra_latency = std::max(shape.intra_latency, node.intra_link.latency);
    }
    const double network = node.networkBandwidth();
    shape.network_bandwidth =
        shape.network_bandwidth == 0 ? network : std::min(shape.network_bandwidth, network);
    shape.network_latency = std::max(shape.network_latency, node.inter_link.latency);
  }
  return shape;
}

}  // namespace

LinearCost p2pCost(const Cluster& cluster, int from, int to) {
  if (from == to) return {};
  const LinkType& link = cluster.linkBetween(from, to);
  return {link.latency, 1.0 / link.effectiveBandwidth()};
}

LinearCost allReduceCost(const Cluster& cluster, const std::vector<int>& group,
                         AllReduceAlgorithm algorithm, double network_ratio) {
  CHORUS_CHECK_CONFIG(priced(algorithm), "cost model: cannot price the all-reduce algorithm '",
                      toString(algorithm), "'");
  const double n = static_cast<double>(group.size());
  if (group.size() <= 1) return {};
  const GroupShape shape = shapeOf(cluster, group);
  const double nodes = static_cast<double>(shape.per_node.size());
  if (nodes == 1) {
    return {2 * (n - 1) * shape.intra_latency, 2 * (n - 1) / n / shape.intra_bandwidth};
  }
  if (algorithm == AllReduceAlgorithm::kFlat) {
    // Every ring step moves S/n over every hop; the slowest hop sets the pace.
    double per_hop = network_ratio / shape.network_bandwidth;
    if (shape.intra_bandwidth > 0) per_hop = std::max(per_hop, 1.0 / shape.intra_bandwidth);
    const double latency = std::max(shape.intra_latency, shape.network_latency);
    return {2 * (n - 1) * latency, 2 * (n - 1) / n * per_hop};
  }
  int local = 1;
  for (const auto& [node, count] : shape.per_node) local = std::max(local, count);
  LinearCost cost;
  if (local > 1) {
    cost.latency += 2 * (local - 1) * shape.intra_latency;
    cost.per_byte += 2.0 * (local - 1) / local / shape.intra_bandwidth;
  }
  cost.latency += 2 * (nodes - 1) * shape.network_latency;
  cost.per_byte += 2 * (nodes - 1) / nodes * network_ratio / shape.network_bandwidth;
  return cost;
}

LinearCost gradientAllReduceCost(const Cluster& cluster, const std::vector<int>& group,
                                 AllReduceAlgorithm algorithm, CodecKind codec, int element_bytes,
                                 double codec_seconds_per_byte) {
  LinearCost cost =
      allReduceCost(cluster, group, algorithm, compressionRatio(codec, element_bytes));
  if (codec == CodecKind::kNone || group.empty()) return cost;
  for (int device : group)
    if (!cluster.sameNode(device, group.front())) {
      cost.per_byte += codec_seconds_per_byte;
      break;
    }
  return cost;
}

double compressionRatio(CodecKind codec, int element_bytes) {
  switch (codec) {
    case CodecKind::kNone:
      return 1;
    case CodecKind::kFp16:
    case CodecKind::kBf16:
      return std::min(1.0, 2.0 / element_bytes);
    case CodecKind::kInt8:
      return std::min(1.0, 1.0 / element_bytes);
    case CodecKind::kTopK:
    case CodecKind::kPowerSgd:
      break;
  }
  CHORUS_THROW(ConfigError, "cost model: cannot price the codec '", toString(codec), "'");
}

}  // namespace chorus::plan
