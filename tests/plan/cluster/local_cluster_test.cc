#include "chorus/plan/local_cluster.h"

#include <gtest/gtest.h>

#include "chorus/core/error.h"
#include "chorus/plan/cluster_file.h"
#include "chorus/plan/cost_model.h"
#include "chorus/plan/fixed_plan.h"
#include "plan/plan_test_util.h"

namespace chorus::plan {
namespace {

constexpr std::uint64_t kGiB = 1ull << 30;

// A CPU as `chorus devices` might measure it: 40 GFLOP/s fp32, 60 bf16, 12 GB/s copy.
MeasuredDevice hostCpu() {
  MeasuredDevice cpu;
  cpu.name = "cpu";
  cpu.description = "test CPU, 1 thread";
  cpu.vendor = "AMD";
  cpu.memory_bytes = 7 * kGiB + 12345;  // not a round size: the file must keep it exactly
  cpu.gflops[static_cast<int>(Dtype::kFp32)] = 40;
  cpu.gflops[static_cast<int>(Dtype::kBf16)] = 60;
  cpu.memory_bandwidth_gbs = 12;
  return cpu;
}

TEST(LocalCluster, EmulationScalesComputeButNotBandwidth) {
  const MeasuredDevice slow = emulateDevice(hostCpu(), "cpu@0.25/1GiB", 0.25, kGiB);
  EXPECT_EQ(slow.name, "cpu@0.25/1GiB");
  EXPECT_DOUBLE_EQ(slow.gflops[static_cast<int>(Dtype::kFp32)], 10);
  EXPECT_DOUBLE_EQ(slow.gflops[static_cast<int>(Dtype::kBf16)], 15);
  EXPECT_DOUBLE_EQ(slow.gflops[static_cast<int>(Dtype::kFp16)], 0);
  EXPECT_DOUBLE_EQ(slow.memory_bandwidth_gbs, 12);
  EXPECT_EQ(slow.memory_bytes, kGiB);
  EXPECT_EQ(emulateDevice(hostCpu(), "cpu", 1, 0).memory_bytes, hostCpu().memory_bytes);
  EXPECT_THROW(emulateDevice(hostCpu(), "x", 0, 0), ConfigError);
  EXPECT_THROW(emulateDevice(hostCpu(), "x", 1.5, 0), ConfigError);
  EXPECT_THROW(emulateDevice(hostCpu(), "x", 0.5, 64 * kGiB), ConfigError);
}

TEST(LocalCluster, MeasuredTypeStatesAchievedRates) {
  const DeviceType type = measuredDeviceType(hostCpu());
  EXPECT_EQ(type.device_class, DeviceClass::kCpu);
  EXPECT_DOUBLE_EQ(type.peak(Dtype::kFp32), 40e9);
  EXPECT_DOUBLE_EQ(type.peak(Dtype::kBf16), 60e9);
  EXPECT_FALSE(type.supports(Dtype::kFp16));
  EXPECT_DOUBLE_EQ(type.memory_bandwidth, 12e9);
  EXPECT_DOUBLE_EQ(type.efficiency, 1);
  MeasuredDevice unmeasured = hostCpu();
  unmeasured.gflops[0] = 0;
  EXPECT_THROW(measuredDeviceType(unmeasured), ConfigError);
  // The shared-memory link: copies in and out of the segment at a quarter of the counted rate.
  const LinkType shm = measuredShmLink(12);
  EXPECT_EQ(shm.name, "shm-measured");
  EXPECT_DOUBLE_EQ(shm.bandwidth, 3e9);
  EXPECT_DOUBLE_EQ(shm.latency, findLinkType("shm")->latency);
}

// The file `chorus devices --cluster-toml` writes parses back to the cluster plan = "auto" builds
// directly (toCluster): the same devices, types, node and link.
TEST(LocalCluster, TheFileAndTheDirectClusterAgree) {
  LocalCluster local;
  local.name = "this-host";
  local.comments = {"measured by a test"};
  local.devices = {emulateDevice(hostCpu(), "cpu", 1, 0), emulateDevice(hostCpu(), "cpu", 1, 0),
                   emulateDevice(hostCpu(), "cpu@0.5", 0.5, 0),
                   emulateDevice(hostCpu(), "cpu@0.6/512MiB", 0.6, 512ull << 20)};
  local.intra_link = measuredShmLink(12);
  for (const Cluster& cluster :
       {parseClusterToml(localClusterToml(local), "local.toml"), toCluster(local)}) {
    EXPECT_EQ(cluster.name(), "this-host");
    ASSERT_EQ(cluster.size(), 4);
    ASSERT_EQ(cluster.nodes().size(), 1u);
    EXPECT_EQ(cluster.nodes()[0].name, "localhost");
    EXPECT_EQ(cluster.nodes()[0].intra_link.name, "shm-measured");
    EXPECT_DOUBLE_EQ(cluster.nodes()[0].intra_link.bandwidth, 3e9);
    EXPECT_DOUBLE_EQ(cluster.linkBetween(0, 3).latency, findLinkType("shm")->latency);
    EXPECT_EQ(cluster.types().size(), 3u);
    for (int i = 0; i < cluster.size(); ++i) {
      const DeviceType& type = cluster.device(i).type;
      const DeviceType expected = measuredDeviceType(local.devices[i]);
      EXPECT_EQ(type.name, expected.name);
      EXPECT_EQ(type.memory_bytes, expected.memory_bytes) << type.name;
      EXPECT_DOUBLE_EQ(type.memory_bandwidth, expected.memory_bandwidth) << type.name;
      EXPECT_DOUBLE_EQ(type.efficiency, 1) << type.name;
      EXPECT_EQ(type.device_class, DeviceClass::kCpu);
      // The file rounds figures to six digits; the direct cluster keeps them.
      for (int d = 0; d < kDtypeCount; ++d)
        EXPECT_NEAR(type.peak_flops[d], expected.peak_flops[d], 1e-6 * expected.peak_flops[d]);
    }
    EXPECT_EQ(cluster.device(3).type.memory_bytes, 512ull << 20);
    EXPECT_DOUBLE_EQ(cluster.device(2).type.peak(Dtype::kFp32), 20e9);
    EXPECT_EQ(cluster.describe(), "4 devices on 1 node: 2 x cpu, 1 x cpu@0.5, 1 x cpu@0.6/512MiB");
  }
}

TEST(LocalCluster, RejectsTwoDevicesOfOneNameThatDiffer) {
  LocalCluster local;
  EXPECT_THROW(localClusterToml(local), ConfigError);
  EXPECT_THROW(toCluster(local), ConfigError);
  local.devices = {hostCpu(), emulateDevice(hostCpu(), "cpu", 0.5, 0)};
  EXPECT_THROW(localClusterToml(local), ConfigError);
  EXPECT_THROW(toCluster(local), ConfigError);
}

TEST(ClusterFile, AMeasuredCpuShadowsTheCatalogCpu) {
  const Cluster cluster = parseClusterToml(R"(
[[device_type]]
name = "cpu"
class = "cpu"
memory = "8GiB"
memory_bandwidth_gbs = 10
fp32_tflops = 0.05
efficiency = 1

[[node]]
devices = [{ type = "cpu" }, { type = "CPU" }]
)",
                                           "host.toml");
  ASSERT_EQ(cluster.size(), 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(cluster.device(i).type.name, "cpu");
    EXPECT_DOUBLE_EQ(cluster.device(i).type.peak(Dtype::kFp32), 0.05e12);
  }
  EXPECT_EQ(cluster.nodes()[0].intra_link.name, "loopback");
  // The catalog's own generic CPU is still there for files that do not shadow it.
  EXPECT_DOUBLE_EQ(findDeviceType("cpu")->peak(Dtype::kFp32), 5.9e12);
}

TEST(ClusterFile, ReadsCustomLinksAndRejectsBadOnes) {
  const Cluster cluster = parseClusterToml(R"(
[[link_type]]
name = "my-shm"
bandwidth_gbs = 4
efficiency = 0.5
latency_us = 7

[[node]]
intra_node_link = "my-shm"
devices = [{ type = "T4", count = 2 }]
)",
                                           "links.toml");
  const LinkType& link = cluster.linkBetween(0, 1);
  EXPECT_EQ(link.name, "my-shm");
  EXPECT_DOUBLE_EQ(link.effectiveBandwidth(), 2e9);
  EXPECT_DOUBLE_EQ(link.latency, 7e-6);
  EXPECT_NE(findLinkType("shm"), nullptr);
  const auto error = [](const std::string& text) {
    try {
      parseClusterToml(text, "c.toml");
    } catch (const ConfigError& e) {
      return e.message();
    }
    return std::string();
  };
  const std::string node = "[[node]]\ndevices = [{ type = \"T4\" }]\n";
  EXPECT_EQ(error("[[link_type]]\nname = \"x\"\n" + node),
            "c.toml:1: link_type[0]: 'bandwidth_gbs' must be > 0");
  EXPECT_EQ(error("[[link_type]]\nname = \"x\"\nbandwidth_gbs = 1\nefficiency = 2\n" + node),
            "c.toml:4: link_type[0]: 'efficiency' must be in (0, 1]");
  EXPECT_EQ(error("[[link_type]]\nname = \"x\"\nbandwidth_gbs = 1\n[[link_type]]\nname = \"X\"\n"
                  "bandwidth_gbs = 2\n" +
                  node),
            "c.toml:4: link_type[1]: link 'X' already exists");
  EXPECT_EQ(error("[[device_type]]\nname = \"d\"\nmemory = \"1GiB\"\nmemory_bandwidth_gbs = 1\n"
                  "fp32_tflops = 1\nefficiency = 0\n" +
                  node),
            "c.toml:6: device_type[0]: 'efficiency' must be in (0, 1]");
  EXPECT_EQ(error("[[device_type]]\nname = \"d\"\nmemory = \"1GiB\"\nmemory_bandwidth_gbs = 1\n"
                  "fp32_tflops = 1\ncore_fraction = 1.5\n" +
                  node),
            "c.toml:6: device_type[0]: 'core_fraction' must be in (0, 1]");
  EXPECT_EQ(error("[[node]]\ncore_contention = -1\ndevices = [{ type = \"T4\" }]\n"),
            "c.toml:2: node 'node0': 'core_contention' must be a finite number in [0, 1e9]");
}

// On a measured type the cost model takes the rates as achieved: a math-bound forward pass is
// FLOPs / measured rate plus the per-layer overhead, whatever the CPU default efficiency.
TEST(CostModel, MeasuredTypesUseTheirOwnEfficiency) {
  Cluster cluster("host");
  const int node = cluster.addNode("n", *findLinkType("shm"), *findLinkType("eth-10g"));
  cluster.addDevices(node, measuredDeviceType(hostCpu()), 1);
  const ModelProfile model = testing::uniformModel(2, 10, 1e9, 4, 4);
  CostOptions options;
  options.layer_overhead_seconds = 0;
  const CostModel cost(cluster, model, options);
  EXPECT_DOUBLE_EQ(cost.efficiency(cluster.device(0).type, Dtype::kFp32), 1);
  EXPECT_DOUBLE_EQ(cost.forwardSeconds(cluster.device(0).type, Dtype::kFp32, 0, 2, 3), 6e9 / 40e9);
  options.calibrations = {{"cpu", Dtype::kFp32, 0.5}};  // a calibration still wins
  const CostModel calibrated(cluster, model, options);
  EXPECT_DOUBLE_EQ(calibrated.forwardSeconds(cluster.device(0).type, Dtype::kFp32, 0, 2, 3),
                   6e9 / 20e9);
}

// Workers that share the host's cores slow each other in proportion to how much of a core the
// others keep busy (an emulated cpu@0.5 computes half the time), up to one whole core.
TEST(CostModel, WorkersSharingCoresSlowEachOtherByTheOthersCoreFraction) {
  LocalCluster local;
  local.devices = {emulateDevice(hostCpu(), "cpu", 1, 0), emulateDevice(hostCpu(), "cpu", 1, 0),
                   emulateDevice(hostCpu(), "cpu@0.5", 0.5, 0)};
  local.core_contention = 0.4;
  const Cluster cluster = parseClusterToml(localClusterToml(local), "local.toml");
  EXPECT_DOUBLE_EQ(cluster.nodes()[0].core_contention, 0.4);
  EXPECT_DOUBLE_EQ(cluster.device(2).type.core_fraction, 0.5);
  const ModelProfile model = testing::uniformModel(2, 10, 1e9, 4, 4);
  CostOptions options;
  options.layer_overhead_seconds = 0;
  const CostModel cost(cluster, model, options);
  const DeviceType& full = cluster.device(0).type;
  const DeviceType& half = cluster.device(2).type;
  // cpu: the others keep 1.5 cores busy, capped at one; cpu@0.5: two whole cores, capped.
  EXPECT_DOUBLE_EQ(cost.coreSlowdown(full), 1.4);
  EXPECT_DOUBLE_EQ(cost.coreSlowdown(half), 1.4);
  EXPECT_DOUBLE_EQ(cost.forwardSeconds(full, Dtype::kFp32, 0, 2, 3), 1.4 * 6e9 / 40e9);
  // Two workers: each is slowed by the other's fraction.
  local.devices.erase(local.devices.begin());
  const Cluster pair = parseClusterToml(localClusterToml(local), "pair.toml");
  const CostModel pair_cost(pair, model, options);
  EXPECT_DOUBLE_EQ(pair_cost.coreSlowdown(pair.device(0).type), 1 + 0.4 * 0.5);
  EXPECT_DOUBLE_EQ(pair_cost.coreSlowdown(pair.device(1).type), 1 + 0.4 * 1);
  // Without a measured contention nothing changes.
  local.core_contention = 0;
  const Cluster free = parseClusterToml(localClusterToml(local), "free.toml");
  EXPECT_DOUBLE_EQ(CostModel(free, model, options).coreSlowdown(free.device(1).type), 1);
}

}  // namespace
}  // namespace chorus::plan
