// The bridge and device-resident buckets on a real GPU (label `gpu`; each test skips without a
// usable CUDA device). Ranks are threads of this process over one in-memory store, so one GPU
// serves them: a CUDA rank beside CPU ranks, and two ranks sharing the GPU, which NCCL would
// refuse and the bridge joins through host memory. Sums are of integers, exact in fp32.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "chorus/comm/hierarchical_all_reduce.h"
#include "chorus/comm/topology.h"
#include "chorus/parallel/gradient_reducer.h"
#include "comm/rank_threads.h"

namespace chorus::comm {
namespace {

#define CHORUS_REQUIRE_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no usable CUDA device"

// Rank r's contribution at element i: (r + 1) * (i % 7 + 1), exact in fp32 when summed.
at::Tensor contribution(int rank, std::int64_t numel) {
  return (at::arange(numel, at::kLong).remainder(7) + 1).to(at::kFloat) * (rank + 1);
}

at::Tensor sumOver(int ranks, std::int64_t numel) {
  at::Tensor sum = at::zeros({numel}, at::kFloat);
  for (int rank = 0; rank < ranks; ++rank) sum += contribution(rank, numel);
  return sum;
}

RankDescriptor onHostA(const std::string& device) {
  RankDescriptor rank;
  rank.host_id = "a";
  if (!device.empty()) {
    rank.vendor = "nvidia";
    rank.device = device;
  }
  return rank;
}

// Rank 0 on cuda:0, ranks 1 and 2 on the CPU: groups {0} and {1, 2}, not native.
TEST(GpuBridge, ACudaRankAndTwoCpuRanksSumExactly) {
  CHORUS_REQUIRE_GPU();
  const Topology topology = Topology::fromDescriptors({onHostA("cuda:0"), onHostA(""), onHostA("")},
                                                      GroupBy::kHostAndVendor);
  ASSERT_FALSE(topology.native());
  for (std::int64_t numel : {std::int64_t{4099}, std::int64_t{600001}}) {
    testing::runRankThreads(3, [&](std::shared_ptr<Communicator> world) {
      for (const char* algorithm : {"hierarchical", "2d", "auto"}) {
        HierarchicalOptions options;
        options.algorithm = parseAllReduceAlgorithm(algorithm);
        options.name = algorithm;
        HierarchicalAllReduce engine(world, topology, options);
        const at::Device device = world->rank() == 0 ? at::Device("cuda:0") : at::Device(at::kCPU);
        at::Tensor tensor = contribution(world->rank(), numel).to(device);
        engine.allReduce(tensor).wait();
        EXPECT_EQ(tensor.device(), device);
        EXPECT_TRUE(at::equal(tensor.cpu(), sumOver(3, numel)))
            << algorithm << ", " << numel << " elements, rank " << world->rank();
      }
    });
  }
}

// Two ranks on one GPU are one-rank groups; auto bridges them (never the flat form, which would
// hand NCCL two ranks of one device).
TEST(GpuBridge, TwoRanksSharingTheGpuMeetInHostMemory) {
  CHORUS_REQUIRE_GPU();
  const Topology topology =
      Topology::fromDescriptors({onHostA("cuda:0"), onHostA("cuda:0")}, GroupBy::kHostAndVendor);
  ASSERT_EQ(topology.numGroups(), 2);
  testing::runRankThreads(2, [&](std::shared_ptr<Communicator> world) {
    HierarchicalAllReduce engine(world, topology, {});
    EXPECT_EQ(engine.choose(1 << 30), AllReduceAlgorithm::kHierarchical);
    at::Tensor tensor = contribution(world->rank(), 100003).to(at::Device("cuda:0"));
    engine.allReduce(tensor, ReduceOp::kAvg).wait();
    EXPECT_TRUE(at::equal(tensor.cpu(), sumOver(2, 100003) / 2)) << "rank " << world->rank();
  });
}

// Two parameters on `device`; backward() gives them the gradients `contribution(rank, ...)`.
std::vector<at::Tensor> parametersOn(at::Device device) {
  std::vector<at::Tensor> parameters{at::zeros({1000}, at::device(device)).requires_grad_(),
                                     at::zeros({37, 3}, at::device(device)).requires_grad_()};
  return parameters;
}

void backward(const std::vector<at::Tensor>& parameters, int rank) {
  at::Tensor loss = at::zeros({}, parameters[0].options());
  for (const at::Tensor& parameter : parameters)
    loss = loss +
           (parameter.reshape({-1}) * contribution(rank, parameter.numel()).to(parameter.device()))
               .sum();
  loss.backward();
}

// A CUDA rank's buckets live on the GPU; across the bridge to a CPU rank the averaged gradients
// are the sums of both, as two CPU ranks would have them.
TEST(GpuReducer, DeviceResidentBucketsAcrossTheBridgeAverageExactly) {
  CHORUS_REQUIRE_GPU();
  const Topology topology =
      Topology::fromDescriptors({onHostA("cuda:0"), onHostA("")}, GroupBy::kHostAndVendor);
  testing::runRankThreads(2, [&](std::shared_ptr<Communicator> world) {
    const int rank = world->rank();
    const at::Device device = rank == 0 ? at::Device("cuda:0") : at::Device(at::kCPU);
    auto parameters = parametersOn(device);
    parallel::ReducerOptions options;
    options.min_bucket_bytes = 1024;  // several buckets
    options.hierarchical = std::make_shared<HierarchicalAllReduce>(world, topology);
    options.device_buckets = true;
    parallel::GradientReducer reducer(parameters, world, options);
    EXPECT_EQ(reducer.bucketDevice(), device);
    reducer.armForFinalBackward();
    backward(parameters, rank);
    reducer.finish(/*global_batch=*/1);
    for (const at::Tensor& parameter : parameters) {
      EXPECT_EQ(parameter.grad().device(), device);
      const at::Tensor want = sumOver(2, parameter.numel()).view(parameter.sizes());
      EXPECT_TRUE(at::equal(parameter.grad().cpu(), want)) << "rank " << rank;
    }
  });
}

// One CUDA rank alone: its buckets' all-reduce goes through NCCL (a group of one).
TEST(GpuReducer, ALoneCudaRankReducesThroughNccl) {
  CHORUS_REQUIRE_GPU();
  testing::runRankThreads(1, [&](std::shared_ptr<Communicator> world) {
    auto parameters = parametersOn(at::Device("cuda:0"));
    parallel::ReducerOptions options;
    options.device_buckets = true;
    parallel::GradientReducer reducer(parameters, world, options);
    EXPECT_TRUE(reducer.bucketDevice().is_cuda());
    reducer.armForFinalBackward();
    backward(parameters, 0);
    reducer.finish(/*global_batch=*/2);
    for (const at::Tensor& parameter : parameters)
      EXPECT_TRUE(at::equal(parameter.grad().cpu(),
                            (contribution(0, parameter.numel()) / 2).view(parameter.sizes())));
  });
}

}  // namespace
}  // namespace chorus::comm
