// Hierarchical and 2-D all-reduce over ranks as threads: results must be bitwise the expected
// integers (values exact in float) for every topology, algorithm, operation and size.
#include "chorus/comm/hierarchical_all_reduce.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>

#include "chorus/core/error.h"
#include "comm/rank_threads.h"

namespace chorus::comm {
namespace {

// Rank r contributes (r + 1) * (i % 7 + 1) at element i: the sum over n ranks is
// n (n + 1) / 2 * (i % 7 + 1), the average (n + 1) / 2 * (i % 7 + 1), both exact in float.
at::Tensor contribution(int rank, int64_t numel) {
  return (at::arange(numel, at::kLong).remainder(7) + 1).to(at::kFloat) * (rank + 1);
}

at::Tensor expected(int size, int64_t numel, ReduceOp op) {
  const double total = size * (size + 1) / 2.0;
  return contribution(0, numel) * (op == ReduceOp::kAvg ? total / size : total);
}

const std::vector<int64_t> kSizes{0, 1, 2, 7, 4099, 300001};

// Runs every algorithm on every size and op, several calls in flight at once, on `groups`.
void checkTopology(const std::vector<std::vector<int>>& groups) {
  const Topology topology = Topology::fromGroups(groups);
  const int size = topology.size();
  testing::runRankThreads(size, [&](std::shared_ptr<Communicator> world) {
    std::vector<std::unique_ptr<HierarchicalAllReduce>> reducers;
    for (auto algorithm : {AllReduceAlgorithm::kFlat, AllReduceAlgorithm::kHierarchical,
                           AllReduceAlgorithm::kTwoD, AllReduceAlgorithm::kAuto}) {
      HierarchicalOptions options;
      options.algorithm = algorithm;
      options.name = toString(algorithm);
      reducers.push_back(std::make_unique<HierarchicalAllReduce>(world, topology, options));
    }
    for (auto op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      for (auto& reducer : reducers) {
        std::vector<at::Tensor> tensors;
        std::vector<Work> works;
        for (int64_t numel : kSizes) {
          tensors.push_back(contribution(world->rank(), numel));
          works.push_back(reducer->allReduce(tensors.back(), op));
        }
        for (size_t index = 0; index < kSizes.size(); ++index) {
          works[index].wait();
          EXPECT_TRUE(at::equal(tensors[index], expected(size, kSizes[index], op)))
              << "rank " << world->rank() << " algorithm "
              << toString(reducer->choose(kSizes[index] * 4)) << " op " << toString(op) << " numel "
              << kSizes[index] << " topology " << topology.describe();
        }
      }
    }
  });
}

TEST(HierarchicalAllReduce, UnevenGroupsOfThreeTwoOne) { checkTopology({{0, 1, 2}, {3, 4}, {5}}); }

TEST(HierarchicalAllReduce, InterleavedUnevenGroups) { checkTopology({{0, 3, 5}, {1, 4}, {2}}); }

TEST(HierarchicalAllReduce, GroupsOfOne) { checkTopology({{0}, {1}}); }

TEST(HierarchicalAllReduce, EvenGroupsOfTwo) { checkTopology({{0, 2}, {1, 3}}); }

TEST(HierarchicalAllReduce, OneGroupOfThree) { checkTopology({{0, 1, 2}}); }

TEST(HierarchicalAllReduce, AutoChoosesBySizeAndTopology) {
  testing::runRankThreads(3, [](std::shared_ptr<Communicator> world) {
    HierarchicalAllReduce flat(world, Topology::singletons(3), {});
    EXPECT_EQ(flat.choose(1 << 30), AllReduceAlgorithm::kFlat);
    HierarchicalOptions options;
    options.name = "grouped";
    HierarchicalAllReduce grouped(world, Topology::fromGroups({{0, 1}, {2}}), options);
    EXPECT_EQ(grouped.choose(1024), AllReduceAlgorithm::kHierarchical);
    EXPECT_EQ(grouped.choose(1 << 20), AllReduceAlgorithm::kTwoD);
  });
}

// CPU ranks beside a GPU rank share no native collective: even one-rank groups take the
// hierarchical form (its leaders meet in host memory), never the flat one; the sums stay exact.
TEST(HierarchicalAllReduce, AWorldWithoutANativeCollectiveIsNeverFlat) {
  std::vector<RankDescriptor> ranks(3);
  for (auto& rank : ranks) rank.host_id = "a";
  ranks[2].vendor = "nvidia";
  ranks[2].device = "cuda:0";
  const Topology bridged = Topology::fromDescriptors(ranks, GroupBy::kHostAndVendor);
  ASSERT_FALSE(bridged.native());
  std::vector<RankDescriptor> alone = ranks;
  alone[1].host_id = "b";  // three one-rank groups
  const Topology singles = Topology::fromDescriptors(alone, GroupBy::kHostAndVendor);
  ASSERT_TRUE(singles.isFlat());
  testing::runRankThreads(3, [&](std::shared_ptr<Communicator> world) {
    HierarchicalAllReduce grouped(world, bridged, {});
    EXPECT_EQ(grouped.choose(1024), AllReduceAlgorithm::kHierarchical);
    HierarchicalOptions options;
    options.name = "singles";
    HierarchicalAllReduce reducer(world, singles, options);
    EXPECT_EQ(reducer.choose(1 << 30), AllReduceAlgorithm::kHierarchical);
    at::Tensor t = contribution(world->rank(), 4099);
    reducer.allReduce(t).wait();
    EXPECT_TRUE(at::equal(t, expected(3, 4099, ReduceOp::kSum)));
  });
}

// A group of one host that holds CPU and GPU ranks cannot reduce inside with one backend.
TEST(HierarchicalAllReduce, RejectsAGroupThatMixesVendors) {
  std::vector<RankDescriptor> ranks(2);
  for (auto& rank : ranks) rank.host_id = "a";
  ranks[1].vendor = "nvidia";
  const Topology by_host = Topology::fromDescriptors(ranks, GroupBy::kHost);
  testing::runRankThreads(2, [&](std::shared_ptr<Communicator> world) {
    EXPECT_THROW(HierarchicalAllReduce(world, by_host, {}), ConfigError);
  });
}

// Only leaders cross the groups in the hierarchical form, with the whole buffer; in the 2-D form
// every rank carries one shard. The hook replaces the leaders' all-reduce.
TEST(HierarchicalAllReduce, LeadersCarryTheBufferAndTheHookReplacesTheirAllReduce) {
  const Topology topology = Topology::fromGroups({{0, 1}, {2, 3}});
  std::atomic<int> hook_calls{0};
  testing::runRankThreads(4, [&](std::shared_ptr<Communicator> world) {
    HierarchicalAllReduce reducer(world, topology, {});
    at::Tensor t = contribution(world->rank(), 1000);
    reducer
        .allReduce(t, ReduceOp::kSum,
                   [&](at::Tensor& tensor, Communicator& leaders) {
                     ++hook_calls;
                     EXPECT_EQ(leaders.size(), 2);
                     leaders.allReduce(tensor).wait();
                   })
        .wait();
    EXPECT_TRUE(at::equal(t, expected(4, 1000, ReduceOp::kSum)));
    const auto stats = reducer.stats();
    const bool leader = topology.localIndex(world->rank()) == 0;
    EXPECT_EQ(stats.count("leaders/all_reduce"), leader ? 1u : 0u);
    if (leader) {
      EXPECT_EQ(stats.at("leaders/all_reduce").bytes, 4000u);
    }
  });
  EXPECT_EQ(hook_calls.load(), 2);
}

TEST(HierarchicalAllReduce, RejectsMismatchedTopologyAndStridedTensors) {
  testing::runRankThreads(2, [](std::shared_ptr<Communicator> world) {
    EXPECT_THROW(HierarchicalAllReduce(world, Topology::singletons(3), {}), ConfigError);
    HierarchicalAllReduce reducer(world, Topology::fromGroups({{0, 1}}), {});
    at::Tensor strided = at::zeros({4, 4}).t();
    EXPECT_THROW(reducer.allReduce(strided), ConfigError);
  });
  EXPECT_EQ(parseAllReduceAlgorithm("2d"), AllReduceAlgorithm::kTwoD);
  EXPECT_THROW(parseAllReduceAlgorithm("tree"), ConfigError);
}

}  // namespace
}  // namespace chorus::comm
