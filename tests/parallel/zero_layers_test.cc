// ZeRO-3's layers on their own (parallel/zero_layers.h): three ranks (threads) hold unlike slices
// of a GPT's parameters, some layers wholly inside one rank's slice; the gathered forward and
// backward give the outputs and gradients of the whole model bit for bit, and no layer keeps its
// bytes at rest, after a backward, or after a forward without autograd.
#include "chorus/parallel/zero_layers.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <map>
#include <thread>

#include "chorus/core/error.h"
#include "chorus/model/model_config.h"
#include "chorus/model/zoo_model.h"
#include "chorus/parallel/gradient_reducer.h"
#include "chorus/parallel/zero.h"
#include "comm/rank_threads.h"

namespace chorus::parallel {
namespace {

std::shared_ptr<model::ZooModel> smallGpt() {
  model::ModelConfig config;
  config.kind = "gpt";
  config.vocab = 16;
  config.layers = 3;
  config.width = 16;
  config.heads = 2;
  config.context = 8;
  return model::makeModel(config, 7);
}

std::vector<std::vector<int>> layersOf(model::ZooModel& model,
                                       const std::vector<at::Tensor>& parameters) {
  std::map<const void*, int> index;
  for (size_t i = 0; i < parameters.size(); ++i)
    index[parameters[i].unsafeGetTensorImpl()] = static_cast<int>(i);
  std::vector<std::vector<int>> layers(model.numLayers());
  for (std::int64_t l = 0; l < model.numLayers(); ++l)
    for (const at::Tensor& parameter : model.layerParameters(l))
      layers[l].push_back(index.at(parameter.unsafeGetTensorImpl()));
  return layers;
}

// This rank's slice [bounds[rank], bounds[rank + 1]) of the parameters flattened in `order`.
at::Tensor sliceOf(const std::vector<at::Tensor>& parameters, const std::vector<int>& order,
                   const std::vector<std::int64_t>& bounds, int rank) {
  std::vector<at::Tensor> flat;
  for (int index : order) flat.push_back(parameters[index].detach().reshape({-1}));
  return at::cat(flat).narrow(0, bounds[rank], bounds[rank + 1] - bounds[rank]).clone();
}

std::int64_t bytesHeld(const std::vector<at::Tensor>& parameters) {
  std::int64_t bytes = 0;
  for (const at::Tensor& parameter : parameters)
    bytes += static_cast<std::int64_t>(parameter.storage().nbytes());
  return bytes;
}

at::Tensor tokensFor(int rank, std::int64_t samples) {
  return at::arange(samples * 8, at::kLong).add(rank).remainder(16).view({samples, 8});
}

TEST(ZeroLayers, GatheredPassesAreTheWholeModelsAndNothingStaysGathered) {
  comm::testing::runRankThreads(3, [](std::shared_ptr<comm::Communicator> comm) {
    const int rank = comm->rank();
    auto reference = smallGpt();
    auto sharded = smallGpt();
    const std::vector<at::Tensor> parameters = sharded->parameters();
    ReducerOptions buckets;
    buckets.bucket_bytes = 2000;
    const std::vector<int> order = flatOrder(bucketLayoutOf(parameters, buckets));
    std::int64_t total = 0;
    for (const at::Tensor& parameter : parameters) total += parameter.numel();
    // Rank 1's slice is small: most layers lie wholly in rank 0's or rank 2's.
    const auto bounds = shardBounds(total, {0.6, 0.05, 0.35});
    at::Tensor shard = sliceOf(parameters, order, bounds, rank);
    ZeroLayers layers(parameters, layersOf(*sharded, parameters), order, bounds, shard, comm);
    EXPECT_EQ(layers.layerCount(), 5);
    EXPECT_EQ(layers.gatheredLayers(), 0);
    EXPECT_EQ(bytesHeld(parameters), 0) << "parameters hold bytes at rest";

    // Unlike shares: rank 1 runs an empty batch, as ZeRO-3 ranks do when their share is done.
    const std::int64_t samples = rank == 1 ? 0 : 2 + rank;
    const at::Tensor tokens = tokensFor(rank, samples);
    const at::Tensor expected = reference->forward(tokens);
    const at::Tensor output = layers.forward(*sharded, tokens);
    EXPECT_TRUE(at::equal(output, expected));
    EXPECT_EQ(layers.gatheredLayers(), 1) << "the last layer waits for its backward";
    output.sum().backward();
    expected.sum().backward();
    EXPECT_EQ(layers.gatheredLayers(), 0) << "a layer stays gathered after its gradients";
    const std::vector<at::Tensor> whole = reference->parameters();
    for (size_t p = 0; p < parameters.size(); ++p)
      EXPECT_TRUE(at::equal(parameters[p].grad(), whole[p].grad())) << "parameter " << p;
    layers.release();

    // Evaluation: every layer is freed after its forward.
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(at::equal(layers.forward(*sharded, tokens), reference->forward(tokens)));
    EXPECT_EQ(layers.gatheredLayers(), 0);
    EXPECT_EQ(bytesHeld(parameters), 0);
  });
}

// A rank that waits for a peer's piece of a layer says so (the trainer excludes the wait from the
// compute its balancer sees): rank 0 starts 300 ms late, so the others wait at their first gather.
TEST(ZeroLayers, WaitsForPeersAreReported) {
  comm::testing::runRankThreads(3, [](std::shared_ptr<comm::Communicator> comm) {
    auto model = smallGpt();
    const std::vector<at::Tensor> parameters = model->parameters();
    const std::vector<int> order = flatOrder(bucketLayoutOf(parameters, ReducerOptions{}));
    std::int64_t total = 0;
    for (const at::Tensor& parameter : parameters) total += parameter.numel();
    const auto bounds = shardBounds(total, {1, 1, 1});
    ZeroLayers layers(parameters, layersOf(*model, parameters), order, bounds,
                      sliceOf(parameters, order, bounds, comm->rank()), comm);
    int begun = 0, ended = 0;
    layers.setWaitHooks({[&] { ++begun; }, [&] { ++ended; }});
    if (comm->rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    torch::NoGradGuard no_grad;
    layers.forward(*model, tokensFor(comm->rank(), 2));
    EXPECT_EQ(begun, ended);
    if (comm->rank() != 0) {
      EXPECT_GE(begun, 1) << "rank " << comm->rank() << " never waited";
    }
  });
}

TEST(ZeroLayers, AShardThatDoesNotMatchItsBoundsIsRefused) {
  comm::testing::runRankThreads(1, [](std::shared_ptr<comm::Communicator> comm) {
    auto model = smallGpt();
    const std::vector<at::Tensor> parameters = model->parameters();
    std::vector<int> order(parameters.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(order.size() - 1 - i);
    std::int64_t total = 0;
    for (const at::Tensor& parameter : parameters) total += parameter.numel();
    EXPECT_THROW(ZeroLayers(parameters, layersOf(*model, parameters), order, {0, total},
                            at::zeros({total - 1}), comm),
                 ConfigError);
    // A layer whose parameters are not one range of the flat order: the first and the last
    // parameter in one "layer".
    std::vector<std::vector<int>> scattered{{0, static_cast<int>(parameters.size()) - 1}};
    EXPECT_THROW(ZeroLayers(parameters, scattered, order, {0, total}, at::zeros({total}), comm),
                 ConfigError);
  });
}

}  // namespace
}  // namespace chorus::parallel
