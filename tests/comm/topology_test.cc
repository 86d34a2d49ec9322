#include "chorus/comm/topology.h"

#include <gtest/gtest.h>

#include <mutex>

#include "chorus/core/error.h"
#include "comm/rank_threads.h"

namespace chorus::comm {
namespace {

RankDescriptor describeRank(std::string host, std::string vendor,
                            LinkClass gpu_link = LinkClass::kPcie) {
  RankDescriptor descriptor;
  descriptor.host_id = std::move(host);
  descriptor.vendor = std::move(vendor);
  descriptor.gpu_link = gpu_link;
  return descriptor;
}

// Two hosts: a has 2 NVLinked NVIDIA GPUs and an AMD GPU, b has 2 CPU workers; ranks interleaved.
std::vector<RankDescriptor> mixedCluster() {
  return {describeRank("a", "nvidia", LinkClass::kNvlink), describeRank("b", "cpu"),
          describeRank("a", "amd"), describeRank("a", "nvidia", LinkClass::kNvlink),
          describeRank("b", "cpu")};
}

TEST(Topology, GroupsByHostWithLeadersAndLinkClasses) {
  const Topology topology = Topology::fromDescriptors(mixedCluster(), GroupBy::kHost);
  EXPECT_EQ(topology.size(), 5);
  EXPECT_EQ(topology.groups(), (std::vector<std::vector<int>>{{0, 2, 3}, {1, 4}}));
  EXPECT_EQ(topology.leaders(), (std::vector<int>{0, 1}));
  EXPECT_EQ(topology.groupOf(4), 1);
  EXPECT_EQ(topology.localIndex(3), 2);
  EXPECT_EQ(topology.linkBetween(0, 3), LinkClass::kNvlink);
  EXPECT_EQ(topology.linkBetween(0, 2), LinkClass::kPcie);  // NVIDIA to AMD on one host
  EXPECT_EQ(topology.linkBetween(1, 4), LinkClass::kSharedMemory);
  EXPECT_EQ(topology.linkBetween(0, 1), LinkClass::kNetwork);
  EXPECT_EQ(topology.intraLink(0), LinkClass::kPcie);  // the slowest pair decides
  EXPECT_EQ(topology.intraLink(1), LinkClass::kSharedMemory);
  EXPECT_EQ(topology.interLink(), LinkClass::kNetwork);
  EXPECT_FALSE(topology.isFlat());
  EXPECT_EQ(
      topology.describe(),
      "5 ranks in 2 groups {0,2,3} {1,4}; intra pcie,shm, inter network; bridged through host "
      "memory");
}

TEST(Topology, GroupsByVendorAndByHostAndVendor) {
  const auto by_vendor = Topology::fromDescriptors(mixedCluster(), GroupBy::kVendor);
  EXPECT_EQ(by_vendor.groups(), (std::vector<std::vector<int>>{{0, 3}, {1, 4}, {2}}));
  auto ranks = mixedCluster();
  ranks.push_back(describeRank("b", "nvidia"));
  const auto both = Topology::fromDescriptors(ranks, GroupBy::kHostAndVendor);
  EXPECT_EQ(both.groups(), (std::vector<std::vector<int>>{{0, 3}, {1, 4}, {2}, {5}}));
  EXPECT_EQ(both.largestGroup(), 2);
}

// NCCL refuses two ranks on one GPU: ranks that share one (emulated devices on one card) are
// groups of their own, whatever the grouping, and the topology is no longer native.
TEST(Topology, RanksSharingAGpuAreGroupsOfTheirOwn) {
  auto onGpu = [](std::string host, std::string device) {
    RankDescriptor rank = describeRank(std::move(host), "nvidia");
    rank.device = std::move(device);
    return rank;
  };
  const std::vector<RankDescriptor> ranks{onGpu("a", "cuda:0"), onGpu("a", "cuda:1"),
                                          onGpu("a", "cuda:0"), onGpu("b", "cuda:0")};
  for (GroupBy by : {GroupBy::kHost, GroupBy::kVendor, GroupBy::kHostAndVendor}) {
    const auto topology = Topology::fromDescriptors(ranks, by);
    EXPECT_EQ(topology.group(topology.groupOf(0)), std::vector<int>{0}) << toString(by);
    EXPECT_EQ(topology.group(topology.groupOf(2)), std::vector<int>{2}) << toString(by);
    EXPECT_FALSE(topology.native()) << toString(by);
  }
  EXPECT_EQ(Topology::fromDescriptors(ranks, GroupBy::kVendor).groups(),
            (std::vector<std::vector<int>>{{0}, {1, 3}, {2}}));
  // Different GPUs, or one GPU index on two hosts, are two devices.
  const std::vector<RankDescriptor> apart{onGpu("a", "cuda:0"), onGpu("a", "cuda:1"),
                                          onGpu("b", "cuda:0")};
  const auto native = Topology::fromDescriptors(apart, GroupBy::kVendor);
  EXPECT_TRUE(native.native());
  EXPECT_EQ(native.numGroups(), 1);
}

TEST(Topology, NativeOnlyWithOneVendor) {
  EXPECT_FALSE(Topology::fromDescriptors(mixedCluster(), GroupBy::kHostAndVendor).native());
  const std::vector<RankDescriptor> cpus{describeRank("a", "cpu"), describeRank("b", "cpu")};
  EXPECT_TRUE(Topology::fromDescriptors(cpus, GroupBy::kHost).native());
  EXPECT_TRUE(Topology::fromGroups({{0, 1}, {2}}).native());
  EXPECT_EQ(Topology::fromDescriptors(mixedCluster(), GroupBy::kHostAndVendor).vendorOf(2), "amd");
  EXPECT_NE(Topology::fromDescriptors(mixedCluster(), GroupBy::kVendor)
                .describe()
                .find("bridged through host memory"),
            std::string::npos);
}

TEST(Topology, ExplicitGroupsAreSortedAndValidated) {
  const auto topology =
      Topology::fromGroups({{5, 3}, {0, 1, 2}, {4}}, LinkClass::kNvlink, LinkClass::kNetwork);
  EXPECT_EQ(topology.groups(), (std::vector<std::vector<int>>{{0, 1, 2}, {3, 5}, {4}}));
  EXPECT_EQ(topology.localIndex(5), 1);
  EXPECT_EQ(topology.leaderOf(1), 3);
  EXPECT_EQ(topology.linkBetween(3, 5), LinkClass::kNvlink);
  EXPECT_EQ(topology.linkBetween(2, 4), LinkClass::kNetwork);
  EXPECT_THROW(Topology::fromGroups({{0, 1}, {1, 2}}), ConfigError);  // rank 1 twice
  EXPECT_THROW(Topology::fromGroups({{0, 3}}), ConfigError);          // rank 1, 2 missing
  EXPECT_THROW(Topology::fromGroups({{0}, {}}), ConfigError);
}

TEST(Topology, FlatWhenNoGroupHasTwoRanksOrThereIsOneGroup) {
  EXPECT_TRUE(Topology::singletons(4).isFlat());
  EXPECT_TRUE(Topology::fromGroups({{0, 1, 2}}).isFlat());
  EXPECT_FALSE(Topology::fromGroups({{0, 1}, {2}}).isFlat());
}

TEST(Topology, JsonNamesGroupsLeadersAndSpeeds) {
  const auto json = Topology::fromGroups({{0, 1}, {2}}).toJson();
  EXPECT_NE(json.find("{\"ranks\": [0, 1], \"leader\": 0, \"link\": \"pcie\"}"), std::string::npos)
      << json;
  EXPECT_NE(json.find("\"inter_link\": \"network\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"network\": {\"bandwidth\": 1.25e+09"), std::string::npos) << json;
}

TEST(Topology, DescriptorRoundTripAndErrors) {
  const auto descriptor = describeRank("node-7", "amd", LinkClass::kNvlink);
  const auto back = RankDescriptor::decode(descriptor.encode());
  EXPECT_EQ(back.host_id, "node-7");
  EXPECT_EQ(back.vendor, "amd");
  EXPECT_EQ(back.gpu_link, LinkClass::kNvlink);
  EXPECT_EQ(back.device, "");
  RankDescriptor gpu = describeRank("node-7", "nvidia");
  gpu.device = "cuda:3";
  EXPECT_EQ(RankDescriptor::decode(gpu.encode()).device, "cuda:3");
  EXPECT_THROW(RankDescriptor::decode("a|b"), ProtocolError);
  EXPECT_THROW(RankDescriptor::decode("a|cpu|pcie"), ProtocolError);
  EXPECT_THROW(describeRank("a|b", "cpu").encode(), ConfigError);
  EXPECT_THROW(parseLinkClass("infiniband"), ConfigError);
  EXPECT_EQ(parseGroupBy("host+vendor"), GroupBy::kHostAndVendor);
}

// Discovery exchanges the descriptors through the communicator: every rank gets the same value.
TEST(Topology, DiscoverAgreesOnEveryRank) {
  const auto ranks = mixedCluster();
  std::mutex mutex;
  std::vector<std::string> seen;
  testing::runRankThreads(5, [&](std::shared_ptr<Communicator> comm) {
    const auto topology = Topology::discover(*comm, ranks[comm->rank()], GroupBy::kHost);
    std::lock_guard<std::mutex> lock(mutex);
    seen.push_back(topology.toJson());
  });
  const auto expected = Topology::fromDescriptors(ranks, GroupBy::kHost).toJson();
  ASSERT_EQ(seen.size(), 5u);
  for (const auto& json : seen) EXPECT_EQ(json, expected);
}

}  // namespace
}  // namespace chorus::comm
