// The local node as measured: turns what `chorus devices` measured on this host (matmul rates,
// copy bandwidth, memory) into a cluster description the planner reads (cluster_file.h), so a plan
// for this machine starts from achieved rates instead of a catalog's datasheet peaks.
//
// Each worker of a job becomes one device. A worker with an emulated speed (`cpu@0.5`,
// docs/architecture.md, "Emulated heterogeneity") is a device whose compute rates are the measured
// ones times the speed, since the emulator pads every compute phase to 1/speed of its time; its
// memory bandwidth stays as measured, because what is not a compute phase (the optimizer step) is
// not padded. A memory budget (`cpu@0.5/512MiB`) becomes the device's memory. Types are named by
// the worker's spec, so "cpu" shadows the catalog's generic server CPU in that file
// (cluster_file.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "chorus/plan/cluster.h"
#include "chorus/plan/device_catalog.h"
#include "chorus/plan/link_catalog.h"

namespace chorus::plan {

// One device as measured on this host. Value type.
struct MeasuredDevice {
  // The type name the cluster file gives it: the worker's device spec ("cpu@0.5", "cuda:0").
  std::string name;
  // What was measured, written as a comment: "AMD EPYC, openblas, 1 thread". Default: "".
  std::string description;
  // Default: "custom".
  std::string vendor = "custom";
  // Default: kCpu.
  DeviceClass device_class = DeviceClass::kCpu;
  // Memory the worker may use: the device's, or its budget. REQUIRES: > 0.
  std::uint64_t memory_bytes = 0;
  // Measured matmul rate per Dtype in GFLOP/s (10^9); 0 where there is no fast path. fp32 is
  // required (> 0).
  double gflops[kDtypeCount] = {0, 0, 0, 0};
  // Measured copy bandwidth in GB/s, read and write counted (device/microbench.h). REQUIRES: > 0.
  double memory_bandwidth_gbs = 0;
  // Fraction of a host core the worker keeps busy computing (DeviceType::core_fraction): its
  // emulated speed. REQUIRES: in (0, 1]. Default: 1.
  double core_fraction = 1;
};

// `device` as a worker of emulated speed `speed` in (0, 1] sees it, named `name`: compute rates
// and core fraction times `speed`, bandwidth unchanged, memory = `memory_budget` when non-zero.
// Throws ConfigError on a speed out of range or a budget larger than the device's memory.
MeasuredDevice emulateDevice(const MeasuredDevice& device, const std::string& name, double speed,
                             std::uint64_t memory_budget);

// The device type of a measured device: its rates as peaks, with efficiency 1 (they are achieved
// rates already). Throws ConfigError unless fp32, bandwidth and memory are positive.
DeviceType measuredDeviceType(const MeasuredDevice& device);

// The shared-memory link between workers of this host whose memory copies at
// `memory_bandwidth_gbs` (read + write counted): every byte is copied into the segment and out
// again, so the link moves about a quarter of that figure in bytes per second; efficiency and
// latency are the catalog's "shm" entry's. Named "shm-measured".
LinkType measuredShmLink(double memory_bandwidth_gbs);

// A one-node cluster of measured devices. Value type.
struct LocalCluster {
  // Default: "local".
  std::string name = "local";
  // Default: "localhost".
  std::string node = "localhost";
  // One per worker, in rank order. Equal names must have equal figures.
  std::vector<MeasuredDevice> devices;
  // Between the workers. Default: the catalog's "shm".
  LinkType intra_link = *findLinkType("shm");
  // How much the CPU workers slow each other down by sharing the host's cores (Node::
  // core_contention), measured. REQUIRES: >= 0. Default: 0 (not measured: no contention).
  double core_contention = 0;
  // Comment lines written at the top (where, when and how it was measured). Default: none.
  std::vector<std::string> comments;
};

// The cluster file (cluster_file.h) describing `cluster`: a [[device_type]] per distinct device,
// a [[link_type]] when the link is not the catalog's, and one [[node]]. parseClusterToml of the
// result gives a cluster of the same devices, figures and link. Throws ConfigError on an empty
// device list, a device measuredDeviceType rejects, or two devices of one name that differ.
std::string localClusterToml(const LocalCluster& cluster);

// The cluster `cluster` describes, built directly (what parseClusterToml(localClusterToml(c))
// gives, with the figures unrounded): how plan = "auto" plans the job's devices without writing
// a file and reading it back. Throws ConfigError as localClusterToml does.
Cluster toCluster(const LocalCluster& cluster);

}  // namespace chorus::plan
