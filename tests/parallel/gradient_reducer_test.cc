// GradientReducer: the default path, the hierarchical path (equal to flat), codecs (within their
// bounds, or exact when lossless), and the local-SGD helpers. Ranks are threads.
#include "chorus/parallel/gradient_reducer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <mutex>

#include "chorus/core/error.h"
#include "comm/rank_threads.h"

namespace chorus::parallel {
namespace {

const std::vector<std::vector<int64_t>> kShapes{{16, 8}, {16}, {4, 16}, {4}, {7, 3}};

std::vector<at::Tensor> makeParameters() {
  std::vector<at::Tensor> parameters;
  for (const auto& shape : kShapes) parameters.push_back(at::zeros(shape).requires_grad_(true));
  return parameters;
}

// Rank r's gradient of parameter p, element i: (r + 1) * (i % 5 + 1 + p), exact in float.
at::Tensor integerGradient(int rank, size_t parameter) {
  at::Tensor values = at::arange(at::zeros(kShapes[parameter]).numel(), at::kLong).remainder(5);
  return ((values + 1 + static_cast<int64_t>(parameter)) * (rank + 1))
      .to(at::kFloat)
      .view(kShapes[parameter]);
}

// The expected averaged gradient over `ranks` ranks and global batch `batch`.
at::Tensor expectedGradient(int ranks, size_t parameter, int64_t batch) {
  return integerGradient(0, parameter) * (ranks * (ranks + 1) / 2) / static_cast<double>(batch);
}

void setGradients(std::vector<at::Tensor>& parameters, int rank) {
  for (size_t index = 0; index < parameters.size(); ++index)
    parameters[index].mutable_grad() = integerGradient(rank, index);
}

ReducerOptions smallBuckets() {
  ReducerOptions options;
  options.bucket_bytes = 300;  // several buckets
  return options;
}

TEST(GradientReducer, DefaultPathAveragesExactly) {
  comm::testing::runRankThreads(3, [](std::shared_ptr<comm::Communicator> comm) {
    auto parameters = makeParameters();
    GradientReducer reducer(parameters, comm, smallBuckets());
    EXPECT_GT(reducer.numBuckets(), 2);
    setGradients(parameters, comm->rank());
    reducer.finish(4);
    for (size_t index = 0; index < parameters.size(); ++index)
      EXPECT_TRUE(at::equal(parameters[index].grad(), expectedGradient(3, index, 4))) << index;
  });
}

// Buckets live on the host, or on the parameters' device when asked (a world one backend spans,
// or a hierarchy that bridges): the same numbers either way. A rank's parameters on two devices
// (here the CPU and the meta device, which holds no data) cannot share buckets.
TEST(GradientReducer, BucketsLiveOnTheParametersDeviceOrTheHost) {
  comm::testing::runRankThreads(2, [](std::shared_ptr<comm::Communicator> comm) {
    for (bool on_device : {false, true}) {
      auto parameters = makeParameters();
      ReducerOptions options = smallBuckets();
      options.device_buckets = on_device;
      GradientReducer reducer(parameters, comm, options);
      EXPECT_EQ(reducer.bucketDevice(), at::Device(at::kCPU));
      for (auto& parameter : parameters) parameter.mutable_grad() = at::Tensor();
      setGradients(parameters, comm->rank());
      // A parameter without a gradient gets one on its own device, holding the average.
      parameters[1].mutable_grad() = at::Tensor();
      reducer.finish(4);
      for (size_t index = 0; index < parameters.size(); ++index) {
        const at::Tensor want = index == 1 ? at::zeros(kShapes[1]) : expectedGradient(2, index, 4);
        EXPECT_EQ(parameters[index].grad().device(), parameters[index].device());
        EXPECT_TRUE(at::equal(parameters[index].grad(), want)) << index;
      }
    }
    std::vector<at::Tensor> split{at::zeros({4}).requires_grad_(true),
                                  at::zeros({4}, at::Device(at::kMeta)).requires_grad_(true)};
    EXPECT_THROW(GradientReducer(split, comm), ConfigError);
  });
}

// Uneven groups {0,1,2} {3} with a forced 2-D form and the hierarchical form: the same integers as
// the flat path, bit for bit (every partial sum is exact).
TEST(GradientReducer, HierarchicalEqualsFlat) {
  const auto topology = comm::Topology::fromGroups({{0, 1, 2}, {3}});
  comm::testing::runRankThreads(4, [&](std::shared_ptr<comm::Communicator> comm) {
    for (auto algorithm : {comm::AllReduceAlgorithm::kHierarchical, comm::AllReduceAlgorithm::kTwoD,
                           comm::AllReduceAlgorithm::kAuto}) {
      comm::HierarchicalOptions hierarchical;
      hierarchical.algorithm = algorithm;
      hierarchical.name = toString(algorithm);
      ReducerOptions options = smallBuckets();
      options.hierarchical =
          std::make_shared<comm::HierarchicalAllReduce>(comm, topology, hierarchical);
      auto parameters = makeParameters();
      GradientReducer reducer(parameters, comm, options);
      for (int step = 0; step < 2; ++step) {
        setGradients(parameters, comm->rank());
        reducer.finish(8);
        for (size_t index = 0; index < parameters.size(); ++index)
          EXPECT_TRUE(at::equal(parameters[index].grad(), expectedGradient(4, index, 8)))
              << toString(algorithm) << " parameter " << index;
      }
    }
  });
}

// Real backward passes with overlap: hooks launch buckets through the hierarchical all-reduce
// while backward runs. Gaussian data: equal to the flat reducer up to reduction order.
TEST(GradientReducer, HierarchicalMatchesFlatWithHooksDuringBackward) {
  const auto topology = comm::Topology::fromGroups({{0, 2}, {1}});
  comm::testing::runRankThreads(3, [&](std::shared_ptr<comm::Communicator> comm) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(100 + comm->rank());
    const at::Tensor input = at::randn({5, 8}, generator, at::kFloat);
    auto flat_parameters = makeParameters();
    auto hier_parameters = makeParameters();
    ReducerOptions options = smallBuckets();
    options.hierarchical = std::make_shared<comm::HierarchicalAllReduce>(comm, topology);
    GradientReducer flat(flat_parameters, comm, smallBuckets());
    GradientReducer hierarchical(hier_parameters, comm, options);
    for (auto* run : {&flat_parameters, &hier_parameters}) {
      auto& p = *run;
      GradientReducer& reducer = run == &flat_parameters ? flat : hierarchical;
      reducer.armForFinalBackward();
      at::Tensor hidden = at::tanh(at::linear(input, p[0] + 0.5, p[1] + 0.1));
      at::Tensor out = at::linear(hidden, p[2] + 0.2, p[3]);
      (out.pow(2).sum() + (p[4] * 2).sum()).backward();
      reducer.finish(15);
    }
    for (size_t index = 0; index < kShapes.size(); ++index)
      EXPECT_TRUE(
          at::allclose(hier_parameters[index].grad(), flat_parameters[index].grad(), 1e-6, 1e-7))
          << index;
  });
}

// int8 among all ranks: each rank's contribution is off by at most half a scale, scale being at
// most its bucket's largest |gradient| / 127.
TEST(GradientReducer, Int8CodecStaysWithinItsBound) {
  comm::testing::runRankThreads(3, [](std::shared_ptr<comm::Communicator> comm) {
    ReducerOptions options = smallBuckets();
    CodecOptions codec;
    codec.kind = CodecKind::kInt8;
    codec.int8_chunk = 16;
    options.codec = makeCodec(codec);
    auto parameters = makeParameters();
    GradientReducer reducer(parameters, comm, options);
    setGradients(parameters, comm->rank());
    reducer.finish(4);
    double bound = 0;  // sum over ranks of (largest gradient of any parameter) / 254, over B
    for (int rank = 0; rank < 3; ++rank) bound += (rank + 1) * (4 + 1 + 4) / 254.0 / 4;
    double worst = 0;
    for (size_t index = 0; index < parameters.size(); ++index)
      worst = std::max(
          worst,
          (parameters[index].grad() - expectedGradient(3, index, 4)).abs().max().item<double>());
    EXPECT_LE(worst, bound * (1 + 1e-5));
    EXPECT_GT(options.codec->stats().calls, 0u);
    EXPECT_EQ(options.codec->state().count("residual/bucket0"), 1u);
  });
}

// A codec on the leaders' group only: top-k keeping everything is lossless, so the result is the
// exact integers, and only leaders run the codec.
TEST(GradientReducer, CodecAmongLeadersOfAHierarchy) {
  const auto topology = comm::Topology::fromGroups({{0, 1}, {2, 3}});
  comm::testing::runRankThreads(4, [&](std::shared_ptr<comm::Communicator> comm) {
    ReducerOptions options = smallBuckets();
    options.hierarchical = std::make_shared<comm::HierarchicalAllReduce>(comm, topology);
    CodecOptions codec;
    codec.kind = CodecKind::kTopK;
    codec.topk_ratio = 1.0;
    options.codec = makeCodec(codec);
    auto parameters = makeParameters();
    GradientReducer reducer(parameters, comm, options);
    setGradients(parameters, comm->rank());
    reducer.finish(2);
    for (size_t index = 0; index < parameters.size(); ++index)
      EXPECT_TRUE(at::equal(parameters[index].grad(), expectedGradient(4, index, 2))) << index;
    const bool leader = topology.localIndex(comm->rank()) == 0;
    EXPECT_EQ(options.codec->stats().calls > 0, leader);
  });
}

TEST(GradientReducer, FinishLocalAndWeightedParameterAverage) {
  comm::testing::runRankThreads(3, [](std::shared_ptr<comm::Communicator> comm) {
    auto parameters = makeParameters();
    GradientReducer reducer(parameters, comm, smallBuckets());
    setGradients(parameters, comm->rank());
    reducer.finishLocal(2);
    for (size_t index = 0; index < parameters.size(); ++index)
      EXPECT_TRUE(at::equal(parameters[index].grad(), integerGradient(comm->rank(), index) / 2.0));
    // Rank r holds parameters equal to r with weight r + 1: the average is (0 + 2 + 6) / 6.
    for (auto& parameter : parameters) parameter.detach().fill_(comm->rank());
    reducer.averageParameters(comm->rank() + 1);
    for (auto& parameter : parameters)
      EXPECT_TRUE(at::allclose(parameter, at::full_like(parameter, 8.0 / 6.0)));
    EXPECT_THROW(reducer.finishLocal(-1), ConfigError);
  });
}

}  // namespace
}  // namespace chorus::parallel
