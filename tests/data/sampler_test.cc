#include "chorus/data/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <thread>
#include <vector>

#include "chorus/core/error.h"
#include "chorus/data/random.h"

namespace chorus::data {
namespace {

TEST(SplitMix64Test, MatchesTheReferenceSequence) {
  // First output of the reference implementation (Vigna's splitmix64.c) for seed 0.
  SplitMix64 random(0);
  EXPECT_EQ(random.next(), 0xe220a8397b1dcdafULL);
}

TEST(SplitMix64Test, BelowStaysInRangeAndHitsEveryValue) {
  SplitMix64 random(7);
  std::vector<int> counts(7, 0);
  for (int i = 0; i < 7000; ++i) {
    const std::uint64_t x = random.below(7);
    ASSERT_LT(x, 7u);
    ++counts[x];
  }
  for (const int count : counts) EXPECT_GT(count, 800);
  EXPECT_EQ(random.below(1), 0u);
}

TEST(SplitMix64Test, SymmetricUnitIsInMinusOneToOne) {
  SplitMix64 random(3);
  float lowest = 1, highest = -1;
  for (int i = 0; i < 10000; ++i) {
    const float x = random.symmetricUnit();
    ASSERT_GE(x, -1.0f);
    ASSERT_LT(x, 1.0f);
    lowest = std::min(lowest, x);
    highest = std::max(highest, x);
  }
  EXPECT_LT(lowest, -0.99f);
  EXPECT_GT(highest, 0.99f);
}

TEST(GlobalSamplerTest, PermutationIsPinnedAcrossPlatforms) {
  // Computed by an independent Python implementation of the same algorithm: a change here breaks
  // the resumption of every checkpointed job, so it must be deliberate.
  GlobalSampler sampler(10, 10, 42);
  EXPECT_EQ(sampler.batch(0), (std::vector<std::int64_t>{2, 5, 0, 3, 7, 1, 6, 9, 4, 8}));
  EXPECT_EQ(sampler.batch(1), (std::vector<std::int64_t>{4, 0, 6, 5, 9, 8, 7, 1, 2, 3}));
}

TEST(GlobalSamplerTest, SameStepGivesSameIdsWhateverWasCalledBefore) {
  GlobalSampler a(1000, 64, 5);
  GlobalSampler b(1000, 64, 5);
  const std::vector<std::int64_t> direct = a.batch(37);
  for (std::int64_t step : {0, 100, 3, 36, 38, 15}) b.batch(step);
  EXPECT_EQ(b.batch(37), direct);
  EXPECT_EQ(a.batch(37), direct);
  EXPECT_EQ(a.batch(0), b.batch(0));
}

TEST(GlobalSamplerTest, EachEpochIsAPermutationOfAFullSubset) {
  const std::int64_t n = 1000, batch = 64;  // 15 batches per epoch, 40 ids dropped
  GlobalSampler sampler(n, batch, 11);
  ASSERT_EQ(sampler.batchesPerEpoch(), 15);
  std::vector<std::set<std::int64_t>> epochs;
  for (std::int64_t epoch = 0; epoch < 3; ++epoch) {
    std::set<std::int64_t> seen;
    for (std::int64_t k = 0; k < 15; ++k) {
      const std::int64_t step = epoch * 15 + k;
      EXPECT_EQ(sampler.epochOf(step), epoch);
      const std::vector<std::int64_t> ids = sampler.batch(step);
      ASSERT_EQ(ids.size(), 64u);
      for (const std::int64_t id : ids) {
        ASSERT_GE(id, 0);
        ASSERT_LT(id, n);
        EXPECT_TRUE(seen.insert(id).second) << "id " << id << " repeats in epoch " << epoch;
      }
    }
    EXPECT_EQ(seen.size(), 960u);
    epochs.push_back(seen);
  }
  EXPECT_NE(sampler.batch(0), sampler.batch(15));
  EXPECT_NE(sampler.batch(15), sampler.batch(30));
  // Different subsets are dropped, so every sample is eventually seen.
  EXPECT_NE(epochs[0], epochs[1]);
}

TEST(GlobalSamplerTest, DifferentSeedsGiveDifferentSequences) {
  EXPECT_NE(GlobalSampler(1000, 100, 1).batch(0), GlobalSampler(1000, 100, 2).batch(0));
}

TEST(GlobalSamplerTest, WithoutShuffleReadsInOrder) {
  GlobalSampler sampler(10, 4, 99, /*shuffle=*/false);
  EXPECT_EQ(sampler.batch(0), (std::vector<std::int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(sampler.batch(1), (std::vector<std::int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(sampler.batch(2), (std::vector<std::int64_t>{0, 1, 2, 3}));
}

TEST(GlobalSamplerTest, RejectsBatchLargerThanDatasetOrBelowOne) {
  EXPECT_THROW(GlobalSampler(10, 11, 0), ConfigError);
  EXPECT_THROW(GlobalSampler(10, 0, 0), ConfigError);
  EXPECT_THROW(GlobalSampler(10, -3, 0), ConfigError);
  EXPECT_NO_THROW(GlobalSampler(10, 10, 0));
  EXPECT_THROW(GlobalSampler(10, 5, 0).batch(-1), ConfigError);
}

TEST(GlobalSamplerTest, StateRoundTripsAndResumesTheSameSequence) {
  GlobalSampler sampler(1000, 64, 5);
  const SamplerState state = sampler.state(47);  // epoch 3, batch 2 of it
  EXPECT_EQ(state.epoch, 3);
  EXPECT_EQ(state.position, 2 * 64);
  EXPECT_EQ(state.step, 47);

  GlobalSampler restarted(1000, 64, 5);
  const std::int64_t step = restarted.resume(state);
  EXPECT_EQ(step, 47);
  EXPECT_EQ(restarted.batch(step), sampler.batch(47));
  EXPECT_EQ(restarted.batch(step + 1), sampler.batch(48));
}

TEST(GlobalSamplerTest, ResumeRejectsAStateOfAnotherConfig) {
  const SamplerState state = GlobalSampler(1000, 64, 5).state(47);
  EXPECT_THROW(GlobalSampler(1000, 32, 5).resume(state), ConfigError);
  EXPECT_THROW(GlobalSampler(500, 64, 5).resume(state), ConfigError);
  EXPECT_THROW(GlobalSampler(1000, 64, 5).resume(SamplerState{0, 0, -1}), ConfigError);
}

TEST(GlobalSamplerTest, ConcurrentCallersAgree) {
  GlobalSampler sampler(5000, 50, 3);
  std::vector<std::vector<std::int64_t>> expected;
  for (std::int64_t step = 0; step < 400; ++step) {
    GlobalSampler fresh(5000, 50, 3);
    expected.push_back(fresh.batch(step));
  }
  std::vector<std::thread> threads;
  std::vector<int> wrong(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (std::int64_t i = 0; i < 400; ++i) {
        const std::int64_t step = (i * (t + 1) * 37) % 400;  // threads hop between epochs
        if (sampler.batch(step) != expected[step]) ++wrong[t];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(wrong, std::vector<int>(4, 0));
}

}  // namespace
}  // namespace chorus::data
