#include "chorus/plan/cluster.h"

#include <sstream>

#include "chorus/core/error.h"

namespace chorus::plan {
namespace {

bool sameFigures(const DeviceType& a, const DeviceType& b) {
  for (int d = 0; d < kDtypeCount; ++d)
    if (a.peak_flops[d] != b.peak_flops[d]) return false;
  return a.memory_bytes == b.memory_bytes && a.memory_bandwidth == b.memory_bandwidth &&
         a.device_class == b.device_class && a.efficiency == b.efficiency &&
         a.core_fraction == b.core_fraction;
}

}  // namespace

int Cluster::addNode(std::string name, const LinkType& intra_link, const LinkType& inter_link,
                     int nics, double core_contention) {
  CHORUS_CHECK_CONFIG(nics >= 1, "node '", name, "': nics must be at least 1, got ", nics);
  CHORUS_CHECK_CONFIG(core_contention >= 0, "node '", name, "': core_contention must be >= 0, got ",
                      core_contention);
  Node node;
  node.name = std::move(name);
  node.intra_link = intra_link;
  node.inter_link = inter_link;
  node.nics = nics;
  node.core_contention = core_contention;
  nodes_.push_back(std::move(node));
  return static_cast<int>(nodes_.size()) - 1;
}

void Cluster::addDevices(int node, const DeviceType& type, int count) {
  CHORUS_CHECK_CONFIG(node >= 0 && node < static_cast<int>(nodes_.size()), "no node ", node);
  CHORUS_CHECK_CONFIG(count >= 0, "node '", nodes_[node].name, "': negative device count");
  int type_id = -1;
  for (size_t t = 0; t < types_.size(); ++t) {
    if (types_[t].name != type.name) continue;
    CHORUS_CHECK_CONFIG(sameFigures(types_[t], type), "device type '", type.name,
                        "' is defined twice with different figures");
    type_id = static_cast<int>(t);
  }
  if (type_id < 0) {
    types_.push_back(type);
    type_id = static_cast<int>(types_.size()) - 1;
  }
  for (int i = 0; i < count; ++i) {
    Device device;
    device.id = static_cast<int>(devices_.size());
    device.node = node;
    device.type_id = type_id;
    device.type = type;
    nodes_[node].devices.push_back(device.id);
    devices_.push_back(std::move(device));
  }
}

const LinkType& Cluster::linkBetween(int a, int b) const {
  const Node& first = nodes_.at(devices_.at(a).node);
  if (sameNode(a, b)) return first.intra_link;
  const Node& second = nodes_.at(devices_.at(b).node);
  return first.inter_link.effectiveBandwidth() <= second.inter_link.effectiveBandwidth()
             ? first.inter_link
             : second.inter_link;
}

std::string Cluster::describe() const {
  std::ostringstream out;
  out << devices_.size() << " device" << (devices_.size() == 1 ? "" : "s") << " on "
      << nodes_.size() << " node" << (nodes_.size() == 1 ? "" : "s") << ":";
  for (size_t t = 0; t < types_.size(); ++t) {
    int count = 0;
    for (const auto& device : devices_) count += device.type_id == static_cast<int>(t);
    out << (t ? ", " : " ") << count << " x " << types_[t].name;
  }
  return out.str();
}

}  // namespace chorus::plan
