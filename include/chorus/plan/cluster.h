// The cluster model: nodes, the devices in them, and the links between devices.
//
// A Cluster is what the planner plans for and the simulator runs on. Devices are numbered
// 0..n-1 in node order; a plan's rank refers to a cluster device by that number. Two devices of one
// node talk over the node's intra-node link (NVLink, PCIe, ...); devices of different nodes over
// the nodes' inter-node links (InfiniBand, RoCE, Ethernet), whose bandwidth a node shares among its
// devices (times its NIC count). Clusters come from TOML files (cluster_file.h) or are built in
// code (tests, benchmarks).
#pragma once

#include <string>
#include <vector>

#include "chorus/plan/device_catalog.h"
#include "chorus/plan/link_catalog.h"

namespace chorus::plan {

// One node (host). Value type.
struct Node {
  std::string name;
  LinkType intra_link;
  // The node's network link to other nodes and how many such ports it has.
  LinkType inter_link;
  int nics = 1;
  // How much CPU workers of this node slow each other down by sharing cores (SMT siblings, more
  // workers than cores): a CPU worker's compute takes 1 + core_contention x min(1, sum of the
  // other CPU workers' DeviceType::core_fraction) times its time alone. Measured on the host
  // (bench/plan_validation.py); Default: 0 (every worker has a core of its own).
  double core_contention = 0;
  // Cluster device ids of this node's devices, in order.
  std::vector<int> devices;

  // Bytes per second the node can send to other nodes (all NICs, after efficiency).
  double networkBandwidth() const { return inter_link.effectiveBandwidth() * nics; }
};

// One device. Value type.
struct Device {
  int id = 0;       // index in Cluster::devices()
  int node = 0;     // index in Cluster::nodes()
  int type_id = 0;  // index in Cluster::types()
  DeviceType type;
};

// A described cluster. Value type; not synchronized (build it, then share it read-only).
class Cluster {
 public:
  explicit Cluster(std::string name = "cluster") : name_(std::move(name)) {}

  // Adds a node and returns its index. REQUIRES: nics >= 1, core_contention >= 0.
  int addNode(std::string name, const LinkType& intra_link, const LinkType& inter_link,
              int nics = 1, double core_contention = 0);
  // Appends `count` devices of `type` to node `node`. Types are told apart by name: two types of
  // one name must be equal in every figure (a cluster file renames overridden types).
  void addDevices(int node, const DeviceType& type, int count);

  const std::string& name() const { return name_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Device>& devices() const { return devices_; }
  const Device& device(int id) const { return devices_.at(id); }
  // Distinct device types in order of first appearance.
  const std::vector<DeviceType>& types() const { return types_; }
  int size() const { return static_cast<int>(devices_.size()); }

  bool sameNode(int a, int b) const { return devices_.at(a).node == devices_.at(b).node; }
  // The link a point-to-point transfer between two devices crosses: the node's intra-node link,
  // or between nodes the slower of the two nodes' inter-node links.
  const LinkType& linkBetween(int a, int b) const;
  // "16 devices on 2 nodes: 8 x A100-80, 8 x V100-32".
  std::string describe() const;

 private:
  std::string name_;
  std::vector<Node> nodes_;
  std::vector<Device> devices_;
  std::vector<DeviceType> types_;
};

}  // namespace chorus::plan
