// Load balancing across the replicas of a pipeline job: the shares follow the replicas' times
// (deterministic, reported through TrainerHooks::balancer_seconds), honour `balance` = "off",
// never go below a replica's micro-batches nor above its memory caps, and survive a checkpoint
// so that resume stays bitwise exact. Ranks run as threads over one in-memory store.
#include <gtest/gtest.h>

#include <filesystem>
#include <mutex>

#include "chorus/runtime/checkpoint/checkpoint.h"
#include "runtime/job_fixtures.h"
#include "runtime/trainer_threads.h"

namespace chorus::runtime {
namespace {

// A small GPT (4 layers) on synthetic tokens: 2 replicas x 2 stages, B = 32, 4 micro-batches.
const std::string kJob =
    testing::jobStart({.seed = 5, .devices = "cpu,cpu,cpu,cpu", .balance = "adaptive"},
                      {.steps = 12, .global_batch = 32, .eval_every = 0}) +
    testing::kTinyGpt + testing::optimizerTable({.name = "adamw", .lr = 0.01}) + R"([parallel]
pipeline_stages = 2
replicas = 2
micro_batches = 4
)";

constexpr int kWorld = 4;

// Replica 1 (ranks 2 and 3) reports three times replica 0's seconds per sample: a slower
// pipeline, without the noise of measured times.
TrainerHooks skewedTimes(int rank) {
  TrainerHooks hooks;
  const double per_sample = rank / 2 == 0 ? 1e-3 : 3e-3;
  hooks.balancer_seconds = [per_sample](std::int64_t, std::int64_t samples) {
    return per_sample * static_cast<double>(samples);
  };
  return hooks;
}

struct Outcome {
  std::vector<std::vector<std::int64_t>> shares;  // per step, per rank (rank 0's records)
  std::vector<std::string> rebalances;            // rank 0's non-empty record.rebalance
  std::vector<at::Tensor> parameters;             // the whole model (replica 0's stages)
};

// Runs steps [resume's step or 0, steps) with skewed times, then checkpoints when `dir` is given.
Outcome train(std::int64_t steps, const std::vector<std::string>& extra,
              const std::string& dir = "", const std::string& resume = "") {
  std::vector<std::string> settings = extra;
  if (!dir.empty()) settings.push_back("checkpoint.dir=" + dir);
  Outcome run;
  std::vector<std::vector<at::Tensor>> per_rank(kWorld);
  std::vector<std::vector<std::vector<std::int64_t>>> shares(kWorld);
  const auto errors = testing::runTrainers(kJob, settings, kWorld, [&](Trainer& trainer, int rank) {
    if (!resume.empty()) trainer.resume(resolveCheckpoint(resume, dir));
    const TrainerHooks hooks = skewedTimes(rank);
    while (trainer.nextStep() < steps) {
      const StepRecord record = trainer.step(hooks);
      shares[rank].push_back(record.shares);
      if (rank == 0 && !record.rebalance.empty()) run.rebalances.push_back(record.rebalance);
    }
    if (!dir.empty()) trainer.checkpoint();
    per_rank[rank] = testing::stageParametersOf(trainer);
  });
  for (const auto& error : errors) EXPECT_EQ(error, "");
  for (int rank = 1; rank < kWorld; ++rank) EXPECT_EQ(shares[rank], shares[0]) << "rank " << rank;
  run.shares = shares[0];
  run.parameters = per_rank[0];
  run.parameters.insert(run.parameters.end(), per_rank[1].begin(), per_rank[1].end());
  return run;
}

std::int64_t replicaShare(const std::vector<std::int64_t>& rank_shares, int replica) {
  return rank_shares.at(2 * replica);  // ranks 2r and 2r + 1 run replica r
}

TEST(PipelineBalancer, TheFasterReplicaEndsWithTheLargerShare) {
  const Outcome run = train(12, {});
  ASSERT_EQ(run.shares.size(), 12u);
  // Equal devices: equal start shares, kept through the profiling steps.
  EXPECT_EQ(run.shares[0], (std::vector<std::int64_t>{16, 16, 16, 16}));
  ASSERT_FALSE(run.rebalances.empty());
  EXPECT_NE(run.rebalances[0].find("replica shares 16,16 -> "), std::string::npos)
      << run.rebalances[0];
  // 1 : 3 seconds per sample: ideally 24 : 8.
  const auto& last = run.shares.back();
  EXPECT_GE(replicaShare(last, 0), 2 * replicaShare(last, 1)) << last[0] << "," << last[2];
  for (const auto& step : run.shares) {
    EXPECT_EQ(replicaShare(step, 0) + replicaShare(step, 1), 32);
    EXPECT_GE(replicaShare(step, 1), 4);  // one sample per micro-batch at least
  }
}

TEST(PipelineBalancer, OffKeepsTheStartShares) {
  const Outcome run = train(12, {"balance=off"});
  ASSERT_EQ(run.shares.size(), 12u);
  for (const auto& step : run.shares) EXPECT_EQ(step, (std::vector<std::int64_t>{16, 16, 16, 16}));
  EXPECT_TRUE(run.rebalances.empty());
}

TEST(PipelineBalancer, StaticChangesTheSharesOnce) {
  const Outcome run = train(12, {"balance=static"});
  ASSERT_EQ(run.rebalances.size(), 1u);
  EXPECT_GT(replicaShare(run.shares.back(), 0), replicaShare(run.shares.back(), 1));
}

TEST(PipelineBalancer, AReplicaNeverGoesBelowItsMicroBatches) {
  // Replica 1 reports 50 times replica 0's time per sample: the balancer would empty it, but it
  // keeps one sample for each of its 8 micro-batches.
  std::vector<std::vector<std::int64_t>> shares;
  std::mutex mutex;
  const auto errors = testing::runTrainers(
      kJob, {"parallel.micro_batches=8"}, kWorld, [&](Trainer& trainer, int rank) {
        TrainerHooks hooks;
        const double per_sample = rank / 2 == 0 ? 1e-3 : 5e-2;
        hooks.balancer_seconds = [per_sample](std::int64_t, std::int64_t samples) {
          return per_sample * static_cast<double>(samples);
        };
        for (int step = 0; step < 12; ++step) trainer.step(hooks);
        std::lock_guard<std::mutex> lock(mutex);
        shares.push_back(trainer.shares());
      });
  for (const auto& error : errors) EXPECT_EQ(error, "");
  for (const auto& replicas : shares) {
    EXPECT_EQ(replicas, shares.front());
    EXPECT_GE(replicas.at(1), 8);
    EXPECT_LE(replicas.at(1), 9);  // the fast replica takes all the rest, or all but one
  }
}

TEST(PipelineBalancer, ResumeAfterAShareChangeIsBitwiseExact) {
  const std::string dir = ::testing::TempDir() + "/chorus_pipeline_balancer_resume";
  std::filesystem::remove_all(dir);
  const Outcome straight = train(10, {}, dir + "/straight");
  // The first fit comes after 3 profiling steps (steps 1-3; step 0 is not measured): a
  // checkpoint at step 6 holds changed shares and a balancer in mid-course.
  const Outcome first = train(6, {}, dir + "/split");
  ASSERT_FALSE(first.rebalances.empty());
  EXPECT_NE(first.shares.back(), first.shares.front());
  const Outcome resumed = train(10, {}, dir + "/split", "latest");
  ASSERT_EQ(resumed.shares.size(), 4u);
  // The resumed run starts at the shares the first one ended with, and goes on as the straight
  // run does: same shares, bitwise the same parameters.
  for (size_t step = 0; step < resumed.shares.size(); ++step)
    EXPECT_EQ(resumed.shares[step], straight.shares[6 + step]) << "step " << 6 + step;
  ASSERT_EQ(resumed.parameters.size(), straight.parameters.size());
  EXPECT_TRUE(testing::bitwiseEqual(resumed.parameters, straight.parameters));
}

TEST(PipelineBalancer, MemoryBudgetsCapAReplicasShare) {
  parallel::PipelineOptions options;
  options.pipeline_stages = 2;
  options.replicas = 2;
  options.micro_batches = 4;
  options.global_batch = 256;
  plan::ModelProfile profile;
  profile.name = "two layers";
  profile.activation_element_bytes = 4;
  profile.layers.assign(2, plan::LayerProfile{"layer", 100, 1000, 24 * 1000.0, 1000});
  const auto memory = std::make_shared<const plan::MemoryModel>(profile);
  // Replica 1's second stage may hold 20 samples per micro-batch (it holds one in flight under
  // 1F1B), and a little more.
  const double budget =
      memory->peakBytes(parallel::stageMemoryRequest(options, 2, 1, 1, 2, 20)) +
      0.5 * (1000 + 24 * 1000) /* < one sample: the received input and what the layer keeps */;
  const std::vector<std::vector<parallel::StageDevice>> devices = {
      {{1.0, 0}, {1.0, 0}}, {{1.0, 0}, {1.0, static_cast<std::uint64_t>(budget)}}};
  EXPECT_EQ(pipelineShareCaps(options, memory, {0, 1, 2}, devices),
            (std::vector<std::int64_t>{0, 20 * 4}));
}

}  // namespace
}  // namespace chorus::runtime
