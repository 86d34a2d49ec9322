#include "chorus/data/sharding.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "chorus/core/error.h"
#include "chorus/data/sampler.h"

namespace chorus::data {
namespace {

TEST(ShardOfTest, UnevenSharesReassembleTheGlobalBatchInOrder) {
  const std::vector<std::int64_t> global = GlobalSampler(1000, 64, 9).batch(3);
  const std::vector<std::int64_t> shares = {5, 17, 42};
  std::vector<std::int64_t> joined;
  for (int rank = 0; rank < 3; ++rank) {
    const std::vector<std::int64_t> shard = shardOf(global, shares, rank);
    EXPECT_EQ(static_cast<std::int64_t>(shard.size()), shares[rank]);
    joined.insert(joined.end(), shard.begin(), shard.end());
  }
  EXPECT_EQ(joined, global);
  EXPECT_EQ(shardOf(global, shares, 1),
            std::vector<std::int64_t>(global.begin() + 5, global.begin() + 22));
}

TEST(ShardOfTest, ZeroShareGivesAnEmptyShard) {
  const std::vector<std::int64_t> global = {7, 8, 9};
  EXPECT_TRUE(shardOf(global, {0, 3, 0}, 0).empty());
  EXPECT_EQ(shardOf(global, {0, 3, 0}, 1), global);
  EXPECT_TRUE(shardOf(global, {0, 3, 0}, 2).empty());
}

TEST(ShardOfTest, RejectsSharesThatDoNotSumToTheBatch) {
  std::vector<std::int64_t> global(64);
  std::iota(global.begin(), global.end(), 0);
  EXPECT_THROW(shardOf(global, {5, 17, 41}, 0), ConfigError);
  EXPECT_THROW(shardOf(global, {5, 17, 43}, 2), ConfigError);
  EXPECT_THROW(shardOf(global, {-1, 23, 42}, 1), ConfigError);
  EXPECT_THROW(shardOf(global, {5, 17, 42}, 3), ConfigError);
  EXPECT_THROW(shardOf(global, {5, 17, 42}, -1), ConfigError);
}

TEST(MicroBatchesTest, SplitsIntoChunksOfAtMostTheLimit) {
  std::vector<std::int64_t> ids(17);
  std::iota(ids.begin(), ids.end(), 100);
  const auto chunks = microBatches(ids, 8);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0].size(), 8u);
  EXPECT_EQ(chunks[1].size(), 8u);
  EXPECT_EQ(chunks[2], (std::vector<std::int64_t>{116}));
  std::vector<std::int64_t> joined;
  for (const auto& chunk : chunks) joined.insert(joined.end(), chunk.begin(), chunk.end());
  EXPECT_EQ(joined, ids);
}

TEST(MicroBatchesTest, EmptyListGivesNoMicroBatches) { EXPECT_TRUE(microBatches({}, 8).empty()); }

TEST(MicroBatchesTest, ExactMultipleHasNoShortTail) {
  const auto chunks = microBatches(std::vector<std::int64_t>(16, 1), 8);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[1].size(), 8u);
}

TEST(MicroBatchesTest, RejectsLimitBelowOne) {
  EXPECT_THROW(microBatches({1, 2}, 0), ConfigError);
  EXPECT_THROW(microBatches({1, 2}, -4), ConfigError);
}

}  // namespace
}  // namespace chorus::data
