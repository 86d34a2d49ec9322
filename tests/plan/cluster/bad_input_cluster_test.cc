// Bad-input table, cluster files (CLU- rows of docs/errors.md): what `chorus plan --cluster` and
// `chorus simulate --cluster` refuse, each message naming the file, the line and the key.
#include <gtest/gtest.h>

#include "bad_input_table.h"
#include "chorus/plan/cluster_file.h"

namespace chorus::plan {
namespace {

using chorus::testing::BadInputRow;

struct ClusterRow {
  BadInputRow row;
  std::string toml;
};

// gtest prints a failing row by its id.
void PrintTo(const ClusterRow& param, std::ostream* out) { *out << param.row.id; }

const std::vector<ClusterRow>& clusterRows() {
  static const std::vector<ClusterRow> rows = {
      {{"CLU-01", "ConfigError", "cluster.toml:1: Error while parsing table header: expected ']'"},
       "[[node]\ndevices = []\n"},
      {{"CLU-02", "ConfigError", "cluster.toml:1: unknown key 'nodes_per_rack'; known: "},
       "nodes_per_rack = 2\n[[node]]\ndevices = [{ type = \"T4\" }]\n"},
      {{"CLU-03", "ConfigError", "no [[node]] tables: a cluster needs at least one node"},
       "name = \"lab\"\n"},
      {{"CLU-04", "ConfigError", "cluster.toml:1: node 'node0': 'devices' is required"},
       "[[node]]\ncount = 2\n"},
      {{"CLU-05", "ConfigError", "cluster.toml:2: node 'node0': 'devices' must be an array"},
       "[[node]]\ndevices = \"A100-80\"\n"},
      {{"CLU-06", "ConfigError", "node 'node0': unknown device type 'A1000'; known: "},
       "[[node]]\ndevices = [{ type = \"A1000\" }]\n"},
      {{"CLU-07", "ConfigError", "node 'node0': 'intra_node_link': unknown link type 'warp'"},
       "[[node]]\nintra_node_link = \"warp\"\ndevices = [{ type = \"T4\" }]\n"},
      {{"CLU-08", "ConfigError", "node 'node0': 'count' must be in [1, 1048576], got 0"},
       "[[node]]\ndevices = [{ type = \"T4\", count = 0 }]\n"},
      {{"CLU-09", "ConfigError", "node 'node0': 'count' must be an integer"},
       "[[node]]\ndevices = [{ type = \"T4\", count = 2.5 }]\n"},
      {{"CLU-10", "ConfigError", "node 'node0': 'memory': invalid size 'lots'"},
       "[[node]]\ndevices = [{ type = \"T4\", memory = \"lots\" }]\n"},
      {{"CLU-11", "ConfigError", "node 'node0': 'nics' must be in [1, 1024], got 0"},
       "[[node]]\nnics = 0\ndevices = [{ type = \"T4\" }]\n"},
      {{"CLU-12", "ConfigError", "two nodes are named 'a'"},
       "[[node]]\nname = \"a\"\ndevices = [{ type = \"T4\" }]\n"
       "[[node]]\nname = \"a\"\ndevices = [{ type = \"T4\" }]\n"},
      {{"CLU-13", "ConfigError", "device_type[0]: 'memory' is required"},
       "[[device_type]]\nname = \"x\"\nfp32_tflops = 1\nmemory_bandwidth_gbs = 100\n"
       "[[node]]\ndevices = [{ type = \"x\" }]\n"},
      {{"CLU-14", "ConfigError", "device_type[0]: 'efficiency' must be in (0, 1]"},
       "[[device_type]]\nname = \"x\"\nmemory = \"8GiB\"\nfp32_tflops = 1\n"
       "memory_bandwidth_gbs = 100\nefficiency = 1.5\n[[node]]\ndevices = [{ type = \"x\" }]\n"},
      {{"CLU-15", "ConfigError",
        "cluster.toml:5: device_type[0]: 'fp32_tflops' must be a finite number in [0, 1e9]"},
       "[[device_type]]\nname = \"x\"\nmemory = \"8GiB\"\nmemory_bandwidth_gbs = 100\n"
       "fp32_tflops = inf\n[[node]]\ndevices = [{ type = \"x\" }]\n"},
      {{"CLU-16", "ConfigError", "link_type[0]: 'bandwidth_gbs' must be > 0"},
       "[[link_type]]\nname = \"slow\"\nbandwidth_gbs = 0\n"
       "[[node]]\ndevices = [{ type = \"T4\" }]\n"},
      {{"CLU-17", "ConfigError", "link_type[0]: 'latency_us' must be a finite number in [0, 1e9]"},
       "[[link_type]]\nname = \"slow\"\nbandwidth_gbs = 1\nlatency_us = -5\n"
       "[[node]]\ndevices = [{ type = \"T4\" }]\n"},
      {{"CLU-18", "ConfigError",
        "node 'node0': 1048576 x 1048576 devices make the cluster larger than 65536 devices"},
       "[[node]]\ncount = 1048576\ndevices = [{ type = \"A100-80\", count = 1048576 }]\n"},
  };
  return rows;
}

class ClusterBadInput : public ::testing::TestWithParam<ClusterRow> {};

TEST_P(ClusterBadInput, IsRefusedNamingFileAndKey) {
  const ClusterRow& param = GetParam();
  try {
    const Cluster cluster = parseClusterToml(param.toml, "cluster.toml");
    ADD_FAILURE() << param.row.id << ": accepted, " << cluster.size() << " devices";
  } catch (const Error& error) {
    EXPECT_TRUE(chorus::testing::matchesRow(error, param.row));
    EXPECT_EQ(error.message().rfind("cluster.toml:", 0), 0u) << error.message();
  }
}

INSTANTIATE_TEST_SUITE_P(Rows, ClusterBadInput, ::testing::ValuesIn(clusterRows()),
                         chorus::testing::rowName<ClusterRow>);

TEST(ClusterBadInputTable, RowsMatchDocsErrorsMd) {
  chorus::testing::expectRowsDocumented("CLU-", chorus::testing::rowsOf(clusterRows()));
}

// The largest cluster still accepted is the documented bound.
TEST(ClusterBadInputTable, ClusterOfTheMaximumSizeIsAccepted) {
  const Cluster cluster = parseClusterToml(
      "[[node]]\ncount = 256\ndevices = [{ type = \"T4\", count = 256 }]\n", "cluster.toml");
  EXPECT_EQ(cluster.size(), 65536);
}

}  // namespace
}  // namespace chorus::plan
