// Invariant 1 for pipelines: the GPT (and the CNN) trained for 10 steps of SGD with momentum by a
// pipeline — 2 or 3 stages, GPipe or 1F1B, with or without activation checkpointing, and a
// 2 replicas x 2 stages hybrid with unequal shares — ends with the parameters of single-process
// training on the same global batches, within 1e-5 relative (L2 per tensor).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "chorus/core/error.h"
#include "pipeline_test_util.h"

namespace chorus::parallel {
namespace {

using testing::Job;
using testing::NamedTensors;
using testing::RankResult;

constexpr double kTolerance = 1e-5;

// Joins the stages of replica 0 into one model's parameters; checks every replica holds the same.
NamedTensors wholeModel(const std::vector<RankResult>& results) {
  NamedTensors replica0;
  for (const RankResult& rank : results)
    if (rank.position.replica == 0) replica0.insert(rank.parameters.begin(), rank.parameters.end());
  for (const RankResult& rank : results) {
    for (const auto& [name, tensor] : rank.parameters) {
      EXPECT_TRUE(at::equal(tensor, replica0.at(name)))
          << "replica " << rank.position.replica << " differs in " << name;
    }
  }
  return replica0;
}

void expectEquivalent(const Job& job, const PipelineOptions& options, const std::string& label) {
  const NamedTensors reference = testing::trainReference(job);
  const NamedTensors initial = [&] {
    auto model = model::makeModel(job.model, job.seed);
    return testing::layerParameters(*model, 0, static_cast<int>(model->numLayers()));
  }();
  // Training moved the parameters: the comparison is not between untouched initializations.
  ASSERT_GT(testing::maxRelativeDifference(initial, reference), 1e-3);
  const std::vector<RankResult> results = testing::trainPipeline(job, options);
  const NamedTensors pipeline = wholeModel(results);
  EXPECT_EQ(pipeline.size(), reference.size());
  const double difference = testing::maxRelativeDifference(pipeline, reference);
  std::printf("%-40s max relative parameter difference after %d steps: %.3g\n", label.c_str(),
              job.steps, difference);
  EXPECT_LT(difference, kTolerance) << label;
  // The last stage reports the loss; it is a sum over the replica's samples, so positive.
  for (const RankResult& rank : results) {
    if (rank.position.stage + 1 == options.pipeline_stages) {
      EXPECT_GT(rank.steps.back().loss_sum, 0.0);
    }
  }
}

struct Case {
  int stages;
  Schedule schedule;
  Checkpointing checkpointing;
};

class PipelineEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineEquivalence, GptMatchesSingleProcess) {
  const Case& c = GetParam();
  PipelineOptions options;
  options.pipeline_stages = c.stages;
  options.schedule = c.schedule;
  options.micro_batches = 4;
  options.partition = "even";
  options.activation_checkpointing = c.checkpointing;
  expectEquivalent(testing::gptJob(), options,
                   "gpt " + std::to_string(c.stages) + " stages " + toString(c.schedule) +
                       " checkpointing=" + toString(c.checkpointing));
}

INSTANTIATE_TEST_SUITE_P(StagesSchedulesCheckpointing, PipelineEquivalence,
                         ::testing::Values(Case{2, Schedule::kGpipe, Checkpointing::kNone},
                                           Case{2, Schedule::kOneFOneB, Checkpointing::kNone},
                                           Case{3, Schedule::kGpipe, Checkpointing::kNone},
                                           Case{3, Schedule::kOneFOneB, Checkpointing::kNone},
                                           Case{2, Schedule::kGpipe, Checkpointing::kStage},
                                           Case{2, Schedule::kOneFOneB, Checkpointing::kStage},
                                           Case{3, Schedule::kGpipe, Checkpointing::kStage},
                                           Case{3, Schedule::kOneFOneB, Checkpointing::kStage},
                                           Case{3, Schedule::kGpipe, Checkpointing::kLayer},
                                           Case{3, Schedule::kOneFOneB, Checkpointing::kLayer}));

TEST(PipelineEquivalenceHybrid, TwoReplicasOfTwoStagesWithUnequalShares) {
  PipelineOptions options;
  options.pipeline_stages = 2;
  options.replicas = 2;
  options.replica_shares = {11, 21};
  options.schedule = Schedule::kOneFOneB;
  options.micro_batches = 3;
  options.partition = "2,4";
  expectEquivalent(testing::gptJob(), options, "gpt hybrid 2x2 shares {11, 21} 1f1b");
  options.schedule = Schedule::kGpipe;
  options.activation_checkpointing = Checkpointing::kStage;
  expectEquivalent(testing::gptJob(), options, "gpt hybrid 2x2 shares {11, 21} gpipe+ckpt");
}

TEST(PipelineEquivalenceCnn, ThreeStagesOneFOneB) {
  PipelineOptions options;
  options.pipeline_stages = 3;
  options.schedule = Schedule::kOneFOneB;
  options.micro_batches = 4;
  options.partition = "auto";
  options.activation_checkpointing = Checkpointing::kLayer;
  expectEquivalent(testing::cnnJob(), options, "cnn 3 stages 1f1b checkpointing=layer");
}

TEST(PipelineEngine, RejectsMismatchedInputs) {
  PipelineOptions options;
  options.pipeline_stages = 2;
  options.micro_batches = 2;
  options.partition = "even";
  options.global_batch = 8;
  testing::runRanks(2, [&](std::shared_ptr<comm::Communicator> world) {
    auto model = model::makeModel(testing::gptJob().model, 1);
    PipelineResources resources;
    resources.world = world;
    PipelineEngine engine(model, options, {0, 3, 6}, resources);
    // Neither stage may start a step that cannot be right, and neither waits for the other.
    const at::Tensor tokens = at::zeros({5, 16}, at::kLong);
    EXPECT_THROW(engine.step(tokens, tokens), ConfigError);
    EXPECT_THROW(PipelineEngine(model, options, {0, 6, 6}, resources), ConfigError);
  });
}

TEST(PipelineEngine, AStageThatNeverComesTimesOut) {
  PipelineOptions options;
  options.pipeline_stages = 2;
  options.micro_batches = 2;
  options.partition = "even";
  options.global_batch = 8;
  options.timeout = std::chrono::milliseconds(1500);
  testing::runRanks(2, [&](std::shared_ptr<comm::Communicator> world) {
    if (world->rank() == 1) {
      // Alive and connected, but never runs its stage.
      std::this_thread::sleep_for(std::chrono::seconds(4));
      return;
    }
    auto model = model::makeModel(testing::gptJob().model, 1);
    PipelineResources resources;
    resources.world = world;
    PipelineEngine engine(model, options, {0, 3, 6}, resources);
    const at::Tensor tokens = at::zeros({8, 16}, at::kLong);
    // A TimeoutError, not the PeerFailure that rank 1's departure after 4 s would cause: the
    // receive's deadline fired first.
    EXPECT_THROW(engine.step(tokens, at::Tensor()), TimeoutError);
  });
}

}  // namespace
}  // namespace chorus::parallel
