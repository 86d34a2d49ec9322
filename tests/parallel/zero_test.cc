// ZeRO's pieces on their own: shard bounds, the reducer's reduce-scatter into a slice (equal to
// the all-reduce's slice, bit for bit, on integer gradients), and the sharded optimizer's step
// (equal to the whole optimizer's, with the parameters rebuilt on every rank). Ranks are threads.
#include "chorus/parallel/zero.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>

#include "chorus/core/error.h"
#include "chorus/parallel/compression.h"
#include "chorus/parallel/gradient_reducer.h"
#include "comm/rank_threads.h"

namespace chorus::parallel {
namespace {

const std::vector<std::vector<int64_t>> kShapes{{16, 8}, {16}, {4, 16}, {4}, {7, 3}};

std::vector<at::Tensor> makeParameters(int seed) {
  std::vector<at::Tensor> parameters;
  for (size_t p = 0; p < kShapes.size(); ++p) {
    const at::Tensor values = at::arange(at::zeros(kShapes[p]).numel(), at::kFloat)
                                  .mul(0.01 * static_cast<double>(seed + p + 1))
                                  .view(kShapes[p]);
    parameters.push_back(values.clone().requires_grad_(true));
  }
  return parameters;
}

// Rank r's gradient of parameter p: integers, so every sum is exact in float.
at::Tensor integerGradient(int rank, size_t parameter) {
  at::Tensor values = at::arange(at::zeros(kShapes[parameter]).numel(), at::kLong).remainder(7);
  return ((values + 1 + static_cast<int64_t>(parameter)) * (rank + 2))
      .to(at::kFloat)
      .view(kShapes[parameter]);
}

std::int64_t totalElements() {
  std::int64_t total = 0;
  for (const auto& shape : kShapes) total += at::zeros(shape).numel();
  return total;
}

ReducerOptions smallBuckets() {
  ReducerOptions options;
  options.bucket_bytes = 300;  // several buckets, some crossing slice bounds
  return options;
}

TEST(ZeroShards, BoundsFollowTheFractionsAndSumExactly) {
  EXPECT_EQ(shardBounds(10, {1, 1}), (std::vector<std::int64_t>{0, 5, 10}));
  EXPECT_EQ(shardBounds(10, {0.5, 0.2, 0.3}), (std::vector<std::int64_t>{0, 5, 7, 10}));
  // 10/3 each: the remainder goes to the lowest ranks.
  EXPECT_EQ(shardBounds(10, {1, 1, 1}), (std::vector<std::int64_t>{0, 4, 7, 10}));
  EXPECT_EQ(shardBounds(7, {0, 1}), (std::vector<std::int64_t>{0, 0, 7}));
  EXPECT_EQ(shardBounds(0, {1, 2}), (std::vector<std::int64_t>{0, 0, 0}));
  EXPECT_THROW(shardBounds(10, {0, 0}), ConfigError);
  EXPECT_THROW(shardBounds(10, {1, -0.5}), ConfigError);
  EXPECT_THROW(shardBounds(10, {}), ConfigError);
}

TEST(ZeroShards, FlatOrderIsTheBucketsOneAfterAnother) {
  EXPECT_EQ(flatOrder({{4, 3}, {2}, {1, 0}}), (std::vector<int>{4, 3, 2, 1, 0}));
}

// Stage 2's reduce-scatter leaves on each rank exactly its slice of what the all-reduce gives
// everyone, and frees the parameters' gradients.
TEST(ZeroReducer, ReduceScatterGivesEachRankItsSliceOfTheAverage) {
  const std::vector<double> fractions{0.5, 0.15, 0.35};
  comm::testing::runRankThreads(3, [&](std::shared_ptr<comm::Communicator> comm) {
    auto whole = makeParameters(0);
    auto sharded = makeParameters(0);
    GradientReducer all_reduce(whole, comm, smallBuckets());
    const auto bounds = shardBounds(totalElements(), fractions);
    const std::int64_t begin = bounds[comm->rank()], end = bounds[comm->rank() + 1];
    ReducerOptions scatter = smallBuckets();
    scatter.scatter_bounds = bounds;
    scatter.scatter_output = at::zeros({end - begin});
    GradientReducer reduce_scatter(sharded, comm, scatter);
    for (size_t p = 0; p < kShapes.size(); ++p) {
      whole[p].mutable_grad() = integerGradient(comm->rank(), p);
      sharded[p].mutable_grad() = integerGradient(comm->rank(), p);
    }
    all_reduce.finish(8);
    reduce_scatter.finish(8);
    const std::vector<int> order = flatOrder(all_reduce.bucketLayout());
    std::vector<at::Tensor> flat;
    for (int index : order) flat.push_back(whole[index].grad().reshape({-1}));
    const at::Tensor expected = at::cat(flat).narrow(0, begin, end - begin);
    EXPECT_TRUE(at::equal(scatter.scatter_output, expected)) << "rank " << comm->rank();
    EXPECT_TRUE(reduce_scatter.gradientsFinite());
    for (const at::Tensor& parameter : sharded) EXPECT_FALSE(parameter.grad().defined());
  });
}

// With a bf16 codec the slices stay within the codec's documented bound (compression.h:
// |Σx − result| ≤ n·2⁻⁸·Σ|x|, here over B) of the exact ones, on gradients that bf16 does not
// hold exactly; a codec that cannot sum in its own format is refused.
TEST(ZeroReducer, ABf16ReduceScatterStaysWithinItsCodecsBound) {
  const std::vector<double> fractions{0.5, 0.15, 0.35};
  comm::testing::runRankThreads(3, [&](std::shared_ptr<comm::Communicator> comm) {
    const int rank = comm->rank();
    const auto bounds = shardBounds(totalElements(), fractions);
    const std::int64_t begin = bounds[rank], end = bounds[rank + 1];
    std::vector<at::Tensor> slices;
    std::vector<std::vector<int>> layout;
    for (const bool compressed : {false, true}) {
      auto parameters = makeParameters(0);
      ReducerOptions options = smallBuckets();
      options.scatter_bounds = bounds;
      options.scatter_output = at::zeros({end - begin});
      CodecOptions codec;
      codec.kind = CodecKind::kBf16;
      codec.error_feedback = false;
      if (compressed) options.codec = makeCodec(codec);
      GradientReducer reducer(parameters, comm, options);
      for (size_t p = 0; p < kShapes.size(); ++p)
        parameters[p].mutable_grad() = integerGradient(rank, p) * 1.0009765625;  // 1 + 2^-10
      reducer.finish(8);
      slices.push_back(options.scatter_output.clone());
      layout = reducer.bucketLayout();
    }
    // Σ|x| over the ranks' gradients (each rank r's is (r + 2) × a positive pattern).
    std::vector<at::Tensor> flat;
    for (int index : flatOrder(layout))
      flat.push_back((integerGradient(0, index) / 2 * (2 + 3 + 4) * 1.0009765625).reshape({-1}));
    const at::Tensor magnitude = at::cat(flat).narrow(0, begin, end - begin) / 8;
    const at::Tensor error = (slices[1] - slices[0]).abs();
    EXPECT_TRUE((error <= 3 * std::pow(2.0, -8) * magnitude + 1e-7).all().item<bool>())
        << "rank " << rank << ": largest error " << error.max().item<double>();
    EXPECT_GT(error.max().item<double>(), 0.0) << "rank " << rank;  // the codec really ran

    auto parameters = makeParameters(0);
    ReducerOptions topk = smallBuckets();
    topk.scatter_bounds = bounds;
    topk.scatter_output = at::zeros({end - begin});
    CodecOptions sparse;
    sparse.kind = CodecKind::kTopK;
    topk.codec = makeCodec(sparse);
    EXPECT_THROW(GradientReducer(parameters, comm, topk), ConfigError);
  });
}

TEST(ZeroReducer, AScatterRefusesBoundsThatDoNotSplitTheGradients) {
  comm::testing::runRankThreads(2, [&](std::shared_ptr<comm::Communicator> comm) {
    auto parameters = makeParameters(0);
    ReducerOptions options = smallBuckets();
    options.scatter_bounds = {0, 10, totalElements() + 1};
    options.scatter_output = at::zeros({comm->rank() == 0 ? 10 : totalElements() - 9});
    EXPECT_THROW(GradientReducer(parameters, comm, options), ConfigError);
  });
}

std::unique_ptr<torch::optim::Optimizer> makeAdamW(std::vector<at::Tensor> parameters) {
  return std::make_unique<torch::optim::AdamW>(std::move(parameters),
                                               torch::optim::AdamWOptions(0.01).weight_decay(0.1));
}

// Three steps of AdamW on uneven slices rebuild, on every rank, the parameters one whole AdamW
// gives (elementwise math on the same numbers), and the slices' state puts back together.
TEST(ZeroOptimizer, SlicedAdamWStepsAsTheWholeOne) {
  const std::vector<double> fractions{0.2, 0.5, 0.3};
  comm::testing::runRankThreads(3, [&](std::shared_ptr<comm::Communicator> comm) {
    auto reference = makeParameters(1);
    auto parameters = makeParameters(1);
    const std::vector<int> order = flatOrder(bucketLayoutOf(parameters, smallBuckets()));
    auto whole = makeAdamW(reference);
    ZeroOptimizer zero(1, parameters, order, shardBounds(totalElements(), fractions), comm,
                       makeAdamW);
    for (int step = 0; step < 3; ++step) {
      for (size_t p = 0; p < kShapes.size(); ++p) {
        reference[p].mutable_grad() = integerGradient(step, p) * 0.01;
        parameters[p].mutable_grad() = integerGradient(step, p) * 0.01;
      }
      whole->step();
      zero.takeGradientSlice();
      zero.clearGradients();
      zero.step();
    }
    for (size_t p = 0; p < kShapes.size(); ++p)
      EXPECT_TRUE(at::allclose(parameters[p], reference[p], 1e-6, 1e-7)) << "parameter " << p;
    const auto state = zero.sliceState();
    ASSERT_EQ(state.count("exp_avg"), 1u);
    EXPECT_EQ(state.at("exp_avg").numel(), zero.end() - zero.begin());
    EXPECT_EQ(state.at("step").item<double>(), 3.0);
  });
}

// zero.redundancy: each rank's replica of its successor's slice — master and AdamW state —
// equals the successor's own after every step, bit for bit: in stage 1 from the whole averaged
// gradient, in stage 2 from the gradient slice the successor sends.
TEST(ZeroOptimizer, AReplicaStepsAsItsOwnersSlice) {
  const std::vector<double> fractions{0.2, 0.5, 0.3};
  for (int stage : {1, 2}) {
    comm::testing::runRankThreads(3, [&](std::shared_ptr<comm::Communicator> comm) {
      auto parameters = makeParameters(1);
      const std::vector<int> order = flatOrder(bucketLayoutOf(parameters, smallBuckets()));
      const auto bounds = shardBounds(totalElements(), fractions);
      ZeroOptimizer zero(stage, parameters, order, bounds, comm, makeAdamW, /*redundant=*/true);
      ASSERT_TRUE(zero.redundant());
      EXPECT_EQ(zero.successor(), (comm->rank() + 1) % 3);
      EXPECT_EQ(zero.replicaBegin(), bounds[zero.successor()]);
      for (int step = 0; step < 3; ++step) {
        for (size_t p = 0; p < kShapes.size(); ++p)
          parameters[p].mutable_grad() = integerGradient(step, p) * 0.01;
        if (stage == 1) {
          zero.takeGradientSlice();
        } else {  // as the reduce-scatter leaves it: the rank's own slice only
          zero.takeGradientSlice();
          zero.exchangeReplicaGradients();
        }
        zero.clearGradients();
        zero.step();
      }
      // Every rank's own slices and states, put together, cut at the successor's range.
      std::vector<std::int64_t> counts;
      for (int r = 0; r < 3; ++r) counts.push_back(bounds[r + 1] - bounds[r]);
      const auto gathered = [&](const at::Tensor& mine) {
        at::Tensor whole = at::empty({totalElements()}, at::kFloat);
        comm->allGatherV(mine.contiguous(), whole, counts).wait();
        return whole.narrow(0, zero.replicaBegin(), zero.replicaEnd() - zero.replicaBegin());
      };
      EXPECT_TRUE(at::equal(gathered(zero.masterSlice()), zero.replicaMasterSlice()));
      const auto own = zero.sliceState(), replica = zero.replicaState();
      for (const char* name : {"exp_avg", "exp_avg_sq"})
        EXPECT_TRUE(at::equal(gathered(own.at(name)), replica.at(name))) << name;
      EXPECT_EQ(replica.at("step").item<double>(), 3.0);
    });
  }
}

// A world of one keeps no replica of itself.
TEST(ZeroOptimizer, ALoneRankKeepsNoReplica) {
  comm::testing::runRankThreads(1, [&](std::shared_ptr<comm::Communicator> comm) {
    auto parameters = makeParameters(0);
    const std::vector<int> order = flatOrder(bucketLayoutOf(parameters, smallBuckets()));
    ZeroOptimizer zero(1, parameters, order, shardBounds(totalElements(), {1.0}), comm, makeAdamW,
                       /*redundant=*/true);
    EXPECT_FALSE(zero.redundant());
  });
}

TEST(ZeroOptimizer, WholeStateIsCutToTheSlice) {
  comm::testing::runRankThreads(2, [&](std::shared_ptr<comm::Communicator> comm) {
    auto parameters = makeParameters(0);
    const std::vector<int> order = flatOrder(bucketLayoutOf(parameters, smallBuckets()));
    ZeroOptimizer zero(2, parameters, order, shardBounds(totalElements(), {0.25, 0.75}), comm,
                       makeAdamW);
    const at::Tensor ramp = at::arange(totalElements(), at::kFloat);
    zero.loadWholeState({{"exp_avg", ramp}, {"exp_avg_sq", ramp * 2}, {"step", at::ones({1})}});
    const auto state = zero.sliceState();
    EXPECT_TRUE(
        at::equal(state.at("exp_avg"), ramp.narrow(0, zero.begin(), zero.end() - zero.begin())));
    EXPECT_THROW(zero.loadWholeState({{"exp_avg", ramp.narrow(0, 0, 5)}}), CheckpointError);
  });
}

}  // namespace
}  // namespace chorus::parallel
