// The link catalog: the interconnects a cluster description may name, with the bandwidth and
// latency the communication cost model (comm_cost.h) uses.
//
// A link's bandwidth is per device and per direction: what one GPU can push into NVLink or
// PCIe, or what one node can push into its network (times the node's NIC count). The catalog keeps
// the nominal figure and the fraction of it collectives reach in practice (`efficiency`), so both
// appear in reports. Figures and sources are in src/plan/cluster/link_catalog.cc.
#pragma once

#include <string>
#include <vector>

namespace chorus::plan {

// One kind of link. Value type.
struct LinkType {
  std::string name;  // catalog key, e.g. "nvswitch-a100", "ib-hdr", "eth-10g"
  // Nominal bandwidth per direction in bytes per second.
  double bandwidth = 0;
  // Fraction of `bandwidth` that bulk transfers and ring collectives reach (nccl-tests busbw over
  // the nominal figure). Default: 1.
  double efficiency = 1;
  // One-message latency in seconds (the alpha of the alpha-beta model).
  double latency = 0;

  // Bandwidth the cost model uses: bandwidth x efficiency.
  double effectiveBandwidth() const { return bandwidth * efficiency; }
};

// The built-in links, intra-node ones first.
const std::vector<LinkType>& linkCatalog();

// Looks a link up by name, case-insensitively; nullptr when unknown.
const LinkType* findLinkType(const std::string& name);

// Comma-separated catalog names, for error messages.
std::string knownLinkTypes();

}  // namespace chorus::plan
