// Cluster description files (TOML): how a user tells the planner what hardware it has.
//
//   name = "lab"                     # optional
//   inter_node_link = "ib-hdr"       # default network of every node; Default: "eth-10g"
//   nics_per_node = 1                # Default: 1
//
//   [[device_type]]                  # optional: a type the catalog lacks (e.g. measured locally)
//   name = "dev-cpu"
//   class = "cpu"                    # "gpu" (Default) or "cpu"
//   vendor = "Intel"                 # Default: "custom"
//   memory = "8GiB"
//   memory_bandwidth_gbs = 25
//   fp32_tflops = 0.087              # also tf32_tflops, bf16_tflops, fp16_tflops; Default: 0
//   efficiency = 1.0                 # fraction of those figures a step reaches; Default: the
//                                    # cost model's default for the class (figures are peaks)
//   core_fraction = 0.5              # of a host core it keeps busy computing (an emulated
//                                    # cpu@0.5 sleeps half the time); Default: 1
//
//   [[link_type]]                    # optional: a link the catalog lacks (e.g. measured locally)
//   name = "local-shm"
//   bandwidth_gbs = 4.2              # per direction; required
//   efficiency = 1.0                 # Default: 1
//   latency_us = 5                   # Default: 0
//
//   [[node]]
//   name = "a100"                    # Default: "node<i>"
//   count = 2                        # identical nodes a100-0, a100-1; Default: 1
//   intra_node_link = "nvswitch-a100"  # Default: "pcie4" ("loopback" for CPU-only nodes)
//   inter_node_link = "ib-hdr"       # Default: the top-level inter_node_link
//   nics = 8                         # Default: nics_per_node
//   core_contention = 0.3            # CPU workers sharing cores slow each other (cluster.h);
//                                    # Default: 0
//   devices = [ { type = "A100-80", count = 8 }, { type = "CPU", memory = "64GiB" } ]
//
// A [[device_type]] or [[link_type]] may take the name of a catalog entry (names compare
// case-insensitively) and then shadows it in this file: `chorus devices --cluster-toml` writes the
// host's CPU workers as measured types named by their specs ("cpu", "cpu@0.5").
// A device entry's `count` defaults to 1; `memory` overrides the type's memory and renames the
// type ("CPU/64GiB") so plans say what they assumed. Every error names the file, the line and the
// key: "cluster.toml:12: node 'n1': unknown device type 'A1000'; known: V100-16, ...".
#pragma once

#include <string>

#include "chorus/plan/cluster.h"

namespace chorus::plan {

// Parses a cluster description. `source` names the text in error messages (usually the path).
// Throws ConfigError on malformed TOML, unknown keys, unknown device or link types, and values of
// the wrong type or range.
Cluster parseClusterToml(const std::string& text, const std::string& source);

// Reads and parses a cluster file. Throws ConfigError when it cannot be read or parsed.
Cluster loadClusterFile(const std::string& path);

}  // namespace chorus::plan
