// Helpers for the plan layer's tests: small clusters and models built in code, random ones with a
// seed, so that every test states exactly what it runs on.
#pragma once

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "chorus/plan/cluster.h"
#include "chorus/plan/device_catalog.h"
#include "chorus/plan/link_catalog.h"
#include "chorus/plan/model_profile.h"

namespace chorus::plan::testing {

inline const DeviceType& type(const std::string& name) { return *findDeviceType(name); }
inline const LinkType& link(const std::string& name) { return *findLinkType(name); }

// One node per entry of `nodes`, each holding the listed device types.
inline Cluster makeCluster(const std::vector<std::vector<std::string>>& nodes,
                           const std::string& intra = "nvswitch-a100",
                           const std::string& inter = "ib-hdr") {
  Cluster cluster("test");
  for (size_t n = 0; n < nodes.size(); ++n) {
    const int node = cluster.addNode("n" + std::to_string(n), link(intra), link(inter));
    for (const auto& name : nodes[n]) cluster.addDevices(node, type(name), 1);
  }
  return cluster;
}

// `layers` identical layers.
inline ModelProfile uniformModel(int layers, double params, double flops, double activation,
                                 double output) {
  ModelProfile model;
  model.name = "uniform";
  for (int i = 0; i < layers; ++i)
    model.layers.push_back({"l" + std::to_string(i), params, flops, activation, output});
  return model;
}

// A random cluster of 2-4 devices on 1-2 nodes, of up to three types.
inline Cluster randomCluster(std::mt19937& random) {
  const std::vector<std::string> names = {"A100-40", "V100-16", "T4", "L4", "RTX3090", "MI250X"};
  std::vector<std::string> pool = names;
  std::shuffle(pool.begin(), pool.end(), random);
  pool.resize(1 + random() % 3);
  const int devices = 2 + static_cast<int>(random() % 3);
  const int nodes = 1 + static_cast<int>(random() % 2);
  const std::vector<std::string> intra = {"nvswitch-a100", "pcie4", "pcie3"};
  const std::vector<std::string> inter = {"ib-hdr", "eth-10g", "eth-100g"};
  Cluster cluster("random");
  std::vector<int> ids;
  for (int n = 0; n < nodes; ++n)
    ids.push_back(cluster.addNode("n" + std::to_string(n), link(intra[random() % intra.size()]),
                                  link(inter[random() % inter.size()])));
  // Devices of a node kept together by type order, as real nodes are.
  for (int d = 0; d < devices; ++d)
    cluster.addDevices(ids[d * nodes / devices], type(pool[random() % pool.size()]), 1);
  return cluster;
}

// A random model of 3-6 layers whose memory needs bind on 16-40 GB devices at a few samples.
inline ModelProfile randomModel(std::mt19937& random) {
  std::uniform_real_distribution<double> unit(0.2, 1.0);
  ModelProfile model;
  model.name = "random";
  const int layers = 3 + static_cast<int>(random() % 4);
  for (int i = 0; i < layers; ++i)
    model.layers.push_back({"l" + std::to_string(i), 2e8 * unit(random), 2e12 * unit(random),
                            4e9 * unit(random), 2e7 * unit(random)});
  return model;
}

}  // namespace chorus::plan::testing
