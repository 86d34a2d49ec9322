#include "chorus/plan/cluster_file.h"

#include <gtest/gtest.h>

#include "chorus_version.h"

#include "chorus/core/error.h"

namespace chorus::plan {
namespace {

// The message of the ConfigError that parsing `text` throws ("" if none).
std::string errorOf(const std::string& text) {
  try {
    parseClusterToml(text, "cluster.toml");
  } catch (const ConfigError& error) {
    return error.message();
  }
  return "";
}

// Whether `text` starts with `prefix`, printing both when not.
::testing::AssertionResult startsWith(const std::string& text, const std::string& prefix) {
  if (text.rfind(prefix, 0) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not start with '" << prefix << "'";
}

TEST(DeviceCatalog, HasTheDatasheetFiguresOfEveryListedType) {
  for (const char* name : {"V100-16", "V100-32", "A100-40", "A100-80", "H100-80", "H200", "L4",
                           "T4", "RTX3090", "RTX4090", "MI250X", "MI300X", "CPU"})
    ASSERT_NE(findDeviceType(name), nullptr) << name;
  const DeviceType& a100 = *findDeviceType("a100-80");  // case-insensitive
  EXPECT_EQ(a100.memory_bytes, 80ull << 30);
  EXPECT_DOUBLE_EQ(a100.peak(Dtype::kBf16), 312e12);
  EXPECT_DOUBLE_EQ(a100.peak(Dtype::kTf32), 156e12);
  EXPECT_DOUBLE_EQ(a100.memory_bandwidth, 2039e9);
  EXPECT_FALSE(findDeviceType("V100-32")->supports(Dtype::kBf16));
  EXPECT_TRUE(findDeviceType("T4")->supports(Dtype::kFp16));
  EXPECT_EQ(findDeviceType("MI300X")->vendor, "AMD");
  EXPECT_EQ(findDeviceType("A1000"), nullptr);
  EXPECT_EQ(parseDtype("bf16"), Dtype::kBf16);
  EXPECT_THROW(parseDtype("fp8"), ConfigError);
}

TEST(LinkCatalog, KnowsIntraAndInterNodeLinks) {
  EXPECT_DOUBLE_EQ(findLinkType("ib-hdr")->bandwidth, 25e9);
  EXPECT_NEAR(findLinkType("nvswitch-a100")->effectiveBandwidth(), 234e9, 1e9);
  EXPECT_DOUBLE_EQ(findLinkType("pcie4")->bandwidth, 31.5e9);
  EXPECT_EQ(findLinkType("token-ring"), nullptr);
}

TEST(ClusterFile, ParsesNodesCountsOverridesAndCustomTypes) {
  const Cluster cluster = parseClusterToml(R"(
name = "lab"
inter_node_link = "ib-hdr"
nics_per_node = 2

[[device_type]]
name = "dev-cpu"
class = "cpu"
memory = "8GiB"
memory_bandwidth_gbs = 25
fp32_tflops = 0.087

[[node]]
name = "gpu"
count = 2
intra_node_link = "nvswitch-a100"
devices = [{ type = "A100-80", count = 4 }, { type = "V100-16" }]

[[node]]
name = "host"
devices = [{ type = "dev-cpu", count = 2 }, { type = "CPU", memory = "64GiB" }]
)",
                                           "lab.toml");
  EXPECT_EQ(cluster.name(), "lab");
  ASSERT_EQ(cluster.nodes().size(), 3u);
  EXPECT_EQ(cluster.nodes()[0].name, "gpu-0");
  EXPECT_EQ(cluster.nodes()[1].name, "gpu-1");
  EXPECT_EQ(cluster.size(), 2 * 5 + 3);
  EXPECT_EQ(cluster.nodes()[0].nics, 2);
  EXPECT_DOUBLE_EQ(cluster.nodes()[0].networkBandwidth(), 2 * 25e9 * 0.96);
  EXPECT_EQ(cluster.nodes()[2].intra_link.name, "loopback");  // CPU-only node default
  EXPECT_EQ(cluster.device(12).type.name, "CPU/64G");
  EXPECT_EQ(cluster.device(12).type.memory_bytes, 64ull << 30);
  EXPECT_EQ(cluster.device(10).type.device_class, DeviceClass::kCpu);
  EXPECT_DOUBLE_EQ(cluster.device(10).type.peak(Dtype::kFp32), 0.087e12);
  EXPECT_EQ(cluster.types().size(), 4u);
  EXPECT_EQ(cluster.linkBetween(0, 1).name, "nvswitch-a100");
  EXPECT_EQ(cluster.linkBetween(0, 5).name, "ib-hdr");
  EXPECT_EQ(cluster.describe(),
            "13 devices on 3 nodes: 8 x A100-80, 2 x V100-16, 2 x dev-cpu, 1 x CPU/64G");
}

TEST(ClusterFile, ErrorsNameTheFileTheLineAndTheKey) {
  EXPECT_TRUE(startsWith(errorOf("[[node]]\nname = \"n1\"\ndevices = [{ type = \"A1000\" }]\n"),
                         "cluster.toml:3: node 'n1': unknown device type 'A1000'; known: V10"));
  EXPECT_EQ(errorOf("nodes = 3\n"),
            "cluster.toml:1: unknown key 'nodes'; known: device_type, inter_node_link, link_type, "
            "name, nics_per_node, node");
  EXPECT_TRUE(startsWith(errorOf("[[node]]\ndevices = [{ type = \"T4\", cuont = 2 }]\n"),
                         "cluster.toml:2: node 'node0': unknown key 'cuont'; kn"));
  EXPECT_TRUE(startsWith(
      errorOf("[[node]]\nintra_node_link = \"nvlink9\"\ndevices = [{ type = \"T4\" }]\n"),
      "cluster.toml:2: node 'node0': 'intra_node_link': unknown link type 'nvlink9'"));
  EXPECT_EQ(errorOf("[[node]]\ndevices = [{ type = \"T4\", count = 0 }]\n"),
            "cluster.toml:2: node 'node0': 'count' must be in [1, 1048576], got 0");
  EXPECT_TRUE(startsWith(errorOf("[[node]]\ndevices = [{ type = \"T4\", memory = \"lots\" }]\n"),
                         "cluster.toml:2: node 'node0': 'memory': inval"));
  EXPECT_EQ(errorOf("name = \"x\"\n\n[[node]]\nname = \"a\"\ndevices = 3\n"),
            "cluster.toml:5: node 'a': 'devices' must be an array");
  EXPECT_TRUE(startsWith(errorOf("name = \"x\"\n"), "cluster.toml:1: no [[node]] table"));
  EXPECT_TRUE(startsWith(errorOf("name = \"x\n"), "cluster.toml:1: "));  // malformed TOML
  EXPECT_EQ(
      errorOf("[[node]]\nname = \"a\"\ndevices = [{ type = \"T4\" }]\n[[node]]\nname = \"a\"\n"
              "devices = [{ type = \"T4\" }]\n"),
      "cluster.toml:4: two nodes are named 'a'");
}

TEST(ClusterFile, ReadsTheExampleClusters) {
  // The source root from the build, not __FILE__: a compiler cache may make that relative.
  const std::string dir = std::string(CHORUS_SOURCE_DIR) + "/examples/clusters/";
  EXPECT_EQ(loadClusterFile(dir + "a100-v100.toml").size(), 16);
  EXPECT_EQ(loadClusterFile(dir + "a100-t4.toml").size(), 8);
  EXPECT_EQ(loadClusterFile(dir + "small-mixed-node.toml").size(), 4);
  const Cluster local = loadClusterFile(dir + "local-2vcpu.toml");  // written by chorus devices
  EXPECT_EQ(local.describe(), "2 devices on 1 node: 1 x cpu, 1 x cpu@0.5");
  EXPECT_EQ(local.linkBetween(0, 1).name, "shm-measured");
  const Cluster mixed = loadClusterFile(dir + "mixed-64.toml");
  EXPECT_EQ(mixed.size(), 64);
  EXPECT_EQ(mixed.types().size(), 4u);
  EXPECT_GE(loadClusterFile(dir + "mixed-1024.toml").size(), 1024);
  EXPECT_THROW(loadClusterFile(dir + "missing.toml"), ConfigError);
}

}  // namespace
}  // namespace chorus::plan
