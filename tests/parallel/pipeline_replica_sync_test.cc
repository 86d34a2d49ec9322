// The replicas' gradient all-reduce of a pipeline (2 replicas x 2 stages, ranks as threads): with
// overlap every bucket is launched during the last micro-batch's backward, without it after the
// schedule, and both give bitwise the same gradients; a codec on it stays within the error bound
// compression.h documents for it.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>

#include "chorus/parallel/compression.h"
#include "pipeline_test_util.h"

namespace chorus::parallel {
namespace {

using testing::Job;
using testing::NamedTensors;

// Each parameter's .grad by name, for the layers [first, last) of `model`.
NamedTensors gradientsOf(model::ZooModel& model, int first, int last) {
  const auto profile = model.profile();
  NamedTensors named;
  for (const auto& item : model.named_parameters(/*recurse=*/true))
    for (int l = first; l < last; ++l)
      if (item.key().rfind(profile[l].name + ".", 0) == 0)
        named[item.key()] = item.value().grad().detach().clone();
  return named;
}

struct SyncResult {
  NamedTensors gradients;  // replica 0's stages: the averaged gradient of the global batch
  std::vector<PipelineStepStats> stats;  // by rank
};

constexpr std::int64_t kShares[] = {11, 21};

// One step of a 2 x 2 pipeline of the GPT with `sync` as its replicas' all-reduce options.
SyncResult oneStep(const ReducerOptions& sync) {
  const Job job = testing::gptJob();
  PipelineOptions options;
  options.pipeline_stages = 2;
  options.replicas = 2;
  options.replica_shares = {kShares[0], kShares[1]};
  options.micro_batches = 3;
  options.partition = "2,4";
  options.global_batch = job.global_batch;
  SyncResult result;
  result.stats.resize(4);
  std::mutex mutex;
  testing::runRanks(4, [&](std::shared_ptr<comm::Communicator> world) {
    auto model = model::makeModel(job.model, job.seed);
    PipelineResources resources;
    resources.world = world;
    resources.replica_sync = sync;
    if (sync.codec) {
      // Every rank its own codec (a codec is per rank: it keeps that rank's error memory).
      CodecOptions codec;
      codec.kind = CodecKind::kBf16;
      codec.error_feedback = false;
      resources.replica_sync.codec = makeCodec(codec);
    }
    PipelineEngine engine(model, options, {0, 2, 6}, resources);
    const data::Batch batch = testing::globalBatch(job, 0);
    const std::int64_t offset = engine.position().replica == 0 ? 0 : kShares[0];
    const std::int64_t share = kShares[engine.position().replica];
    const PipelineStepStats stats =
        engine.step(batch.inputs.narrow(0, offset, share), batch.targets.narrow(0, offset, share));
    std::lock_guard<std::mutex> lock(mutex);
    result.stats[world->rank()] = stats;
    if (engine.position().replica == 0) {
      const NamedTensors mine = gradientsOf(*model, engine.firstLayer(), engine.lastLayer());
      result.gradients.insert(mine.begin(), mine.end());
    }
  });
  return result;
}

ReducerOptions smallBuckets(bool overlap) {
  ReducerOptions sync;
  sync.min_bucket_bytes = 1024;  // several buckets per stage of the small GPT
  sync.overlap = overlap;
  return sync;
}

TEST(PipelineReplicaSync, BucketsGoOutDuringTheLastBackwardOnlyWithOverlapAndAgreeBitwise) {
  const SyncResult on = oneStep(smallBuckets(true));
  const SyncResult off = oneStep(smallBuckets(false));
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_GE(on.stats[rank].sync_buckets, 3) << rank;
    // Every bucket's gradients are final inside the last backward (the stage's first layer's
    // too), so with overlap all of them were launched there.
    EXPECT_EQ(on.stats[rank].sync_buckets_overlapped, on.stats[rank].sync_buckets) << rank;
    EXPECT_EQ(off.stats[rank].sync_buckets_overlapped, 0) << rank;
    EXPECT_TRUE(on.stats[rank].gradients_finite);
  }
  ASSERT_EQ(on.gradients.size(), off.gradients.size());
  for (const auto& [name, gradient] : on.gradients)
    EXPECT_TRUE(at::equal(gradient, off.gradients.at(name))) << name;
}

// Each replica's own gradient sum (Σ over its share's samples), by single-process training.
std::vector<NamedTensors> replicaSums() {
  const Job job = testing::gptJob();
  const data::Batch batch = testing::globalBatch(job, 0);
  std::vector<NamedTensors> sums;
  std::int64_t offset = 0;
  for (const std::int64_t share : kShares) {
    auto model = model::makeModel(job.model, job.seed);
    model
        ->lossSum(model->forward(batch.inputs.narrow(0, offset, share)),
                  batch.targets.narrow(0, offset, share))
        .backward();
    sums.push_back(gradientsOf(*model, 0, static_cast<int>(model->numLayers())));
    offset += share;
  }
  return sums;
}

TEST(PipelineReplicaSync, ABf16CodecStaysWithinItsDocumentedBound) {
  const SyncResult exact = oneStep(smallBuckets(true));
  ReducerOptions compressed = smallBuckets(true);
  compressed.codec = makeCodec(CodecOptions{});  // replaced per rank by a bf16 codec in oneStep
  const SyncResult bf16 = oneStep(compressed);
  const std::vector<NamedTensors> sums = replicaSums();
  const double global_batch = static_cast<double>(testing::gptJob().global_batch);
  double worst_ratio = 0, largest_error = 0;
  for (const auto& [name, expected] : exact.gradients) {
    // compression.h: |Σx − result| ≤ n·2^-8·Σ|x| for n ranks, here divided by B; plus the
    // pipeline's own summation order against one process (1e-5 of Σ|x|).
    const at::Tensor magnitude = (sums[0].at(name).abs() + sums[1].at(name).abs()) / global_batch;
    const at::Tensor bound = (2 * std::pow(2.0, -8) + 1e-5) * magnitude + 1e-12;
    const at::Tensor error = (bf16.gradients.at(name) - expected).abs();
    worst_ratio = std::max(worst_ratio, (error / bound).max().item<double>());
    largest_error = std::max(largest_error, error.max().item<double>());
  }
  std::printf(
      "bf16 codec on the replicas' all-reduce: largest error %.3g, at most %.3f of the "
      "documented bound\n",
      largest_error, worst_ratio);
  EXPECT_LE(worst_ratio, 1.0);
  EXPECT_GT(largest_error, 0.0);  // the codec really ran
}

}  // namespace
}  // namespace chorus::parallel
