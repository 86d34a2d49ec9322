// GradientReducer's bucket sizes (DDP's small first bucket, then bucket_bytes, and at least
// min_buckets buckets per model down to a floor) and the overlap they make possible: with
// `overlap` a bucket's all-reduce is launched from backward's hooks before backward returns,
// without it every launch comes after. The order of events is asserted, never their timing, so
// the tests hold on a loaded host. Ranks are threads.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "chorus/core/error.h"
#include "chorus/parallel/gradient_reducer.h"
#include "comm/rank_threads.h"

namespace chorus::parallel {
namespace {

// Parameters of `floats` elements each, in registration order.
std::vector<at::Tensor> parametersOf(const std::vector<int64_t>& floats) {
  std::vector<at::Tensor> parameters;
  for (int64_t count : floats) parameters.push_back(at::zeros({count}).requires_grad_(true));
  return parameters;
}

// Bucket sizes in parameters, in launch order, of a reducer over `floats` with `options`.
std::vector<size_t> bucketSizes(const std::vector<int64_t>& floats, ReducerOptions options) {
  std::vector<size_t> sizes;
  comm::testing::runRankThreads(1, [&](std::shared_ptr<comm::Communicator> comm) {
    GradientReducer reducer(parametersOf(floats), comm, options);
    for (const auto& bucket : reducer.bucketLayout()) sizes.push_back(bucket.size());
  });
  return sizes;
}

constexpr int64_t kKiB = 1024 / 4;  // floats per KiB
constexpr int64_t kMiB = 1024 * kKiB;

TEST(ReducerOverlap, BucketsFollowDdpAndSpreadEveryModel) {
  // 512 KiB in 8 parameters: 25 MiB would take one bucket; a quarter of the model each.
  EXPECT_EQ(bucketSizes(std::vector<int64_t>(8, 64 * kKiB), {}), (std::vector<size_t>{2, 2, 2, 2}));
  // DDP's rule alone (min_buckets = 1): a 1 MiB first bucket, then 25 MiB.
  ReducerOptions ddp;
  ddp.min_buckets = 1;
  EXPECT_EQ(bucketSizes(std::vector<int64_t>(12, 256 * kKiB), ddp), (std::vector<size_t>{4, 8}));
  // A bucket_bytes below the first bucket's cap caps the first bucket too.
  ddp.bucket_bytes = 512 << 10;
  EXPECT_EQ(bucketSizes(std::vector<int64_t>(12, 256 * kKiB), ddp),
            (std::vector<size_t>{2, 2, 2, 2, 2, 2}));
  // The floor: a 10 KiB model is not cut into buckets of 2.5 KiB.
  EXPECT_EQ(bucketSizes(std::vector<int64_t>(10, kKiB), {}), (std::vector<size_t>{10}));
  // A parameter larger than the cap gets a bucket of its own.
  EXPECT_EQ(bucketSizes({kMiB, 16 * kKiB, 16 * kKiB, 16 * kKiB}, {}), (std::vector<size_t>{3, 1}));
  ReducerOptions bad;
  bad.min_buckets = 0;
  EXPECT_THROW(bucketSizes({kKiB}, bad), ConfigError);
}

// A small MLP (8 -> 64 -> 64 -> 64 -> 4, weights and biases): 4 weight matrices of 2-16 KiB.
struct Mlp {
  std::vector<at::Tensor> parameters;
  Mlp() {
    const std::vector<int64_t> widths{8, 64, 64, 64, 4};
    for (size_t layer = 0; layer + 1 < widths.size(); ++layer) {
      const int64_t in = widths[layer], out = widths[layer + 1];
      at::Tensor weight = (at::arange(out * in, at::kFloat).remainder(7) - 3).mul(0.05);
      parameters.push_back(weight.view({out, in}).clone().requires_grad_(true));
      parameters.push_back(at::full({out}, 0.01 * static_cast<double>(layer)).requires_grad_(true));
    }
  }
  at::Tensor loss(const at::Tensor& input) const {
    at::Tensor x = input;
    for (size_t k = 0; k < parameters.size(); k += 2) {
      x = at::linear(x, parameters[k], parameters[k + 1]);
      if (k + 2 < parameters.size()) x = at::tanh(x);
    }
    return x.pow(2).sum();
  }
};

// What one rank saw in one step: "launch k" before bucket k's all-reduce, "backward returned".
struct StepEvents {
  std::vector<std::string> events;
  bool gradients_final_at_launch = true;
  int buckets = 0;
  std::vector<at::Tensor> gradients;
};

StepEvents runStep(std::shared_ptr<comm::Communicator> comm, bool overlap) {
  Mlp mlp;
  StepEvents seen;
  ReducerOptions options;
  options.overlap = overlap;
  options.min_bucket_bytes = 1024;  // several buckets of this 36 KiB model
  GradientReducer* reducer_seen = nullptr;
  options.hold_launch = [&](int bucket) {
    seen.events.push_back("launch " + std::to_string(bucket));
    const auto layout = reducer_seen->bucketLayout();
    for (int parameter : layout[bucket])
      if (!mlp.parameters[parameter].grad().defined()) seen.gradients_final_at_launch = false;
    return false;  // launched at once
  };
  GradientReducer reducer(mlp.parameters, comm, options);
  reducer_seen = &reducer;
  seen.buckets = reducer.numBuckets();
  const at::Tensor input =
      at::arange(6 * 8, at::kFloat).view({6, 8}).mul(0.1 * (comm->rank() + 1)).sin();
  reducer.armForFinalBackward();
  mlp.loss(input).backward();
  seen.events.push_back("backward returned");
  reducer.finish(12);
  for (const auto& parameter : mlp.parameters) seen.gradients.push_back(parameter.grad().clone());
  return seen;
}

std::vector<std::string> launchesInOrder(int buckets) {
  std::vector<std::string> launches;
  for (int bucket = 0; bucket < buckets; ++bucket)
    launches.push_back("launch " + std::to_string(bucket));
  return launches;
}

TEST(ReducerOverlap, ABucketIsLaunchedBeforeBackwardEndsOnlyWithOverlap) {
  comm::testing::runRankThreads(2, [](std::shared_ptr<comm::Communicator> comm) {
    const StepEvents on = runStep(comm, /*overlap=*/true);
    const StepEvents off = runStep(comm, /*overlap=*/false);
    ASSERT_GE(on.buckets, 3);
    EXPECT_TRUE(on.gradients_final_at_launch);
    // With overlap every bucket is launched from the hooks, in order, while backward runs (the
    // last one when the first layer's gradients are final, still inside backward).
    std::vector<std::string> expected = launchesInOrder(on.buckets);
    expected.push_back("backward returned");
    EXPECT_EQ(on.events, expected);
    // Without, finish() launches them all after backward.
    expected = launchesInOrder(off.buckets);
    expected.insert(expected.begin(), "backward returned");
    EXPECT_EQ(off.events, expected);
    // The same buckets, reduced the same way: the same gradients, bit for bit.
    for (size_t index = 0; index < on.gradients.size(); ++index)
      EXPECT_TRUE(at::equal(on.gradients[index], off.gradients[index])) << index;
  });
}

TEST(ReducerOverlap, HeldBucketsAreLaunchedInOrderWhenReleased) {
  // A trainer emulating a slower device holds every bucket back during backward and releases them
  // after it: the same collectives in the same order, so the same gradients, bit for bit.
  comm::testing::runRankThreads(2, [](std::shared_ptr<comm::Communicator> comm) {
    const StepEvents direct = runStep(comm, /*overlap=*/true);
    Mlp mlp;
    ReducerOptions options;
    options.min_bucket_bytes = 1024;
    std::vector<int> ready;
    options.hold_launch = [&](int bucket) {
      ready.push_back(bucket);
      return comm->rank() == 0;  // rank 1 launches at once: the ranks need not agree
    };
    GradientReducer reducer(mlp.parameters, comm, options);
    const at::Tensor input =
        at::arange(6 * 8, at::kFloat).view({6, 8}).mul(0.1 * (comm->rank() + 1)).sin();
    reducer.armForFinalBackward();
    mlp.loss(input).backward();
    EXPECT_EQ(reducer.heldBuckets(), comm->rank() == 0 ? reducer.numBuckets() : 0);
    if (comm->rank() == 0) {
      ASSERT_TRUE(reducer.launchNextHeld());
      EXPECT_EQ(reducer.heldBuckets(), reducer.numBuckets() - 1);
    }
    reducer.finish(12);  // launches the rest, oldest first
    EXPECT_EQ(reducer.heldBuckets(), 0);
    EXPECT_FALSE(reducer.launchNextHeld());
    std::vector<int> expected;
    for (int bucket = 0; bucket < reducer.numBuckets(); ++bucket) expected.push_back(bucket);
    EXPECT_EQ(ready, expected);
    for (size_t index = 0; index < mlp.parameters.size(); ++index)
      EXPECT_TRUE(at::equal(mlp.parameters[index].grad(), direct.gradients[index])) << index;
  });
}

TEST(ReducerOverlap, HoldLaunchIsCalledOncePerBucketEvenWithoutBackward) {
  // A rank with a zero share runs no backward: finish() launches every bucket, each announced.
  comm::testing::runRankThreads(2, [](std::shared_ptr<comm::Communicator> comm) {
    Mlp mlp;
    ReducerOptions options;
    options.min_bucket_bytes = 1024;
    std::vector<int> launched;
    options.hold_launch = [&](int bucket) {
      launched.push_back(bucket);
      return false;
    };
    GradientReducer reducer(mlp.parameters, comm, options);
    for (int step = 0; step < 2; ++step) {
      if (comm->rank() == 0) {
        reducer.armForFinalBackward();
        mlp.loss(at::ones({2, 8})).backward();
      }
      reducer.finish(2);
    }
    std::vector<int> expected;
    for (int step = 0; step < 2; ++step)
      for (int bucket = 0; bucket < reducer.numBuckets(); ++bucket) expected.push_back(bucket);
    EXPECT_EQ(launched, expected);
  });
}

}  // namespace
}  // namespace chorus::parallel
