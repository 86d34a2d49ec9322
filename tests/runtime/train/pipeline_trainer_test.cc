// A pipeline plan run by the Trainer against a data-parallel plan on one rank (invariant 1), its
// evaluation through the pipeline, and bitwise exact resume from its checkpoints. Ranks run as
// threads over one in-memory store.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <mutex>

#include "chorus/runtime/checkpoint/checkpoint.h"
#include "runtime/job_fixtures.h"
#include "runtime/trainer_threads.h"

namespace chorus::runtime {
namespace {

// A small GPT (4 layers: embedding, 2 blocks, head) on synthetic tokens, SGD with momentum; as
// plain data parallelism (the reference) and as pipelines of 4 micro-batches (kGptJob).
// SGD's momentum (0.9) is its default, not written: tests switch to optimizer.name=adamw.
const std::string kGptDataParallelJob =
    testing::jobStart({.seed = 3, .balance = "off"},
                      {.steps = 10, .global_batch = 32, .eval_every = 0, .eval_samples = 64}) +
    testing::kTinyGpt + testing::optimizerTable({.name = "sgd", .lr = 0.03, .warmup_steps = 2});
// Pipeline keys are refused without a pipeline (they would do nothing), so only here.
const std::string kGptJob = std::string(kGptDataParallelJob) + "[parallel]\nmicro_batches = 4\n";

constexpr std::int64_t kSteps = 10;
constexpr std::int64_t kEvalSamples = 64;

struct Trained {
  std::vector<at::Tensor> parameters;  // the whole model, in order
  std::vector<double> losses;          // per step
  std::pair<double, double> evaluation;
};

Trained trainReference() {
  Trained result;
  const auto errors = testing::runTrainers(kGptDataParallelJob, {}, 1, [&](Trainer& trainer, int) {
    for (std::int64_t step = 0; step < kSteps; ++step) result.losses.push_back(trainer.step().loss);
    result.parameters = testing::parametersOf(trainer);
    result.evaluation = trainer.evaluate(kEvalSamples);
  });
  EXPECT_EQ(errors[0], "");
  return result;
}

// Trains on stages x replicas threads; joins the stages of replica 0 into the whole model and
// checks that every replica holds bitwise the same stage parameters. `hooks_of(rank)` gives each
// rank's hooks; `shares`, when given, receives every step's replica shares (rank 0's records).
Trained trainPipeline(int stages, int replicas, const std::vector<std::string>& extra = {},
                      const std::function<TrainerHooks(int rank)>& hooks_of = {},
                      std::vector<std::vector<std::int64_t>>* shares = nullptr) {
  const int world = stages * replicas;
  std::vector<std::vector<at::Tensor>> per_rank(world);
  std::vector<std::vector<double>> losses(world);
  std::vector<std::pair<double, double>> evaluations(world);
  std::vector<std::string> settings = {
      "parallel.pipeline_stages=" + std::to_string(stages),
      "parallel.replicas=" + std::to_string(replicas),
      "devices=" + std::string(world == 2 ? "cpu,cpu" : "cpu,cpu,cpu,cpu")};
  settings.insert(settings.end(), extra.begin(), extra.end());
  const auto errors =
      testing::runTrainers(kGptJob, settings, world, [&](Trainer& trainer, int rank) {
        const TrainerHooks hooks = hooks_of ? hooks_of(rank) : TrainerHooks{};
        for (std::int64_t step = 0; step < kSteps; ++step) {
          const StepRecord record = trainer.step(hooks);
          if (rank == 0 && shares) shares->push_back(record.shares);
          losses[rank].push_back(record.loss);
          EXPECT_EQ(record.shares.size(), static_cast<size_t>(world));
          EXPECT_EQ(record.compute_seconds.size(), static_cast<size_t>(world));
        }
        per_rank[rank] = testing::stageParametersOf(trainer);
        evaluations[rank] = trainer.evaluate(kEvalSamples);
      });
  for (const auto& error : errors) EXPECT_EQ(error, "");
  Trained result;
  for (int s = 0; s < stages; ++s)
    for (const auto& tensor : per_rank[s]) result.parameters.push_back(tensor);
  for (int r = 1; r < replicas; ++r)
    for (int s = 0; s < stages; ++s)
      EXPECT_TRUE(testing::bitwiseEqual(per_rank[r * stages + s], per_rank[s]))
          << "replica " << r << " stage " << s << " differs from replica 0";
  // Every rank reports the same losses and evaluation.
  for (int rank = 1; rank < world; ++rank) {
    EXPECT_EQ(losses[rank], losses[0]);
    EXPECT_EQ(evaluations[rank], evaluations[0]);
  }
  result.losses = losses[0];
  result.evaluation = evaluations[0];
  return result;
}

void expectEquivalent(const Trained& pipeline, const Trained& reference, const char* label) {
  ASSERT_EQ(pipeline.parameters.size(), reference.parameters.size()) << label;
  const double difference =
      testing::maxRelativeDifference(pipeline.parameters, reference.parameters);
  std::printf("%-32s max relative parameter difference after %lld steps: %.3g\n", label,
              static_cast<long long>(kSteps), difference);
  EXPECT_LT(difference, 1e-5) << label;
  ASSERT_EQ(pipeline.losses.size(), reference.losses.size());
  for (size_t i = 0; i < reference.losses.size(); ++i)
    EXPECT_NEAR(pipeline.losses[i], reference.losses[i], 1e-5 * reference.losses[i])
        << label << " step " << i;
  // Accuracy counts argmax hits: allow a 1e-6 parameter difference to flip one of 1024 tokens.
  EXPECT_NEAR(pipeline.evaluation.first, reference.evaluation.first, 1.0 / 1024 + 1e-12) << label;
  EXPECT_NEAR(pipeline.evaluation.second, reference.evaluation.second,
              1e-5 * reference.evaluation.second)
      << label;
}

TEST(PipelineTrainer, MatchesTheDataParallelTrainer) {
  const Trained reference = trainReference();
  // Training moved the parameters and lowered the loss: the comparison means something.
  ASSERT_LT(reference.losses.back(), reference.losses.front());
  expectEquivalent(trainPipeline(2, 1), reference, "2 stages, 1f1b, auto cut");
  expectEquivalent(trainPipeline(2, 2,
                                 {"parallel.schedule=gpipe", "parallel.partition=[1, 3]",
                                  "parallel.activation_checkpointing=stage"}),
                   reference, "2 replicas x 2 stages, gpipe");
}

TEST(PipelineTrainer, MatchesTheDataParallelTrainerWhenTheBalancerMovesShares) {
  const Trained reference = trainReference();
  // Replica 1 reports three times replica 0's seconds per sample (a deterministic stand-in for a
  // slower pipeline), so the balancer moves samples to replica 0 after its profiling steps.
  const auto hooks_of = [](int rank) {
    TrainerHooks hooks;
    const double per_sample = rank / 2 == 0 ? 1e-3 : 3e-3;
    hooks.balancer_seconds = [per_sample](std::int64_t, std::int64_t samples) {
      return per_sample * static_cast<double>(samples);
    };
    return hooks;
  };
  std::vector<std::vector<std::int64_t>> shares;
  expectEquivalent(trainPipeline(2, 2, {"balance=adaptive"}, hooks_of, &shares), reference,
                   "2 x 2, shares moved mid-run");
  // The comparison covers a change of shares: equal at first, replica 0 larger at the end.
  ASSERT_EQ(shares.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(shares.front(), (std::vector<std::int64_t>{16, 16, 16, 16}));
  EXPECT_GT(shares.back()[0], shares.back()[2]);
}

TEST(PipelineTrainer, PlansTheSameCutsAndSharesOnEveryRank) {
  std::mutex mutex;
  std::vector<std::vector<int>> cuts;
  std::vector<std::vector<std::int64_t>> shares;
  const auto errors = testing::runTrainers(kGptJob,
                                           {"parallel.pipeline_stages=2", "parallel.replicas=2",
                                            "parallel.partition=even", "devices=cpu,cpu,cpu,cpu"},
                                           4, [&](Trainer& trainer, int rank) {
                                             EXPECT_EQ(trainer.position().replica, rank / 2);
                                             EXPECT_EQ(trainer.position().stage, rank % 2);
                                             std::lock_guard<std::mutex> lock(mutex);
                                             cuts.push_back(trainer.cuts());
                                             shares.push_back(trainer.shares());
                                           });
  for (const auto& error : errors) EXPECT_EQ(error, "");
  ASSERT_EQ(cuts.size(), 4u);
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(cuts[rank], (std::vector<int>{0, 2, 4}));
    EXPECT_EQ(shares[rank], (std::vector<std::int64_t>{16, 16}));  // equal speeds
  }
}

TEST(PipelineTrainer, ReplicaSharesFollowTheSlowestStage) {
  parallel::PipelineOptions options;
  options.pipeline_stages = 2;
  options.replicas = 2;
  options.micro_batches = 4;
  options.global_batch = 60;
  // Two layers of equal work, one per stage. Replica 0's slowest stage runs at 1.0, replica 1's
  // at 0.5: shares 2 : 1.
  std::vector<model::LayerProfile> profile(2);
  profile[0].forward_flops = profile[1].forward_flops = 1000;
  const std::vector<std::vector<parallel::StageDevice>> devices = {{{1.0, 0}, {1.0, 0}},
                                                                   {{0.5, 0}, {1.0, 0}}};
  EXPECT_EQ(pipelineReplicaShares(options, profile, {0, 1, 2}, devices),
            (std::vector<std::int64_t>{40, 20}));
  // A very slow replica still gets one sample per micro-batch.
  const std::vector<std::vector<parallel::StageDevice>> skewed = {{{1.0, 0}, {1.0, 0}},
                                                                  {{0.01, 0}, {1.0, 0}}};
  EXPECT_EQ(pipelineReplicaShares(options, profile, {0, 1, 2}, skewed),
            (std::vector<std::int64_t>{56, 4}));
}

// Trains to `steps` on 2 stages (resuming from `resume` when given), checkpoints, and returns
// the whole model's parameters.
std::vector<at::Tensor> trainAndCheckpoint(std::int64_t steps, const std::string& dir,
                                           const std::string& resume = "") {
  std::vector<std::vector<at::Tensor>> per_rank(2);
  const auto errors =
      testing::runTrainers(kGptJob,
                           {"parallel.pipeline_stages=2", "devices=cpu,cpu", "optimizer.name=adamw",
                            "optimizer.lr=0.01", "checkpoint.dir=" + dir},
                           2, [&](Trainer& trainer, int rank) {
                             if (!resume.empty()) trainer.resume(resolveCheckpoint(resume, dir));
                             while (trainer.nextStep() < steps) trainer.step();
                             trainer.checkpoint();
                             per_rank[rank] = testing::stageParametersOf(trainer);
                           });
  for (const auto& error : errors) EXPECT_EQ(error, "");
  std::vector<at::Tensor> whole = per_rank[0];
  whole.insert(whole.end(), per_rank[1].begin(), per_rank[1].end());
  return whole;
}

TEST(PipelineTrainer, ResumeIsBitwiseExactOnTheSameLayout) {
  const std::string dir = ::testing::TempDir() + "/chorus_pipeline_resume";
  std::filesystem::remove_all(dir);
  const auto straight = trainAndCheckpoint(8, dir + "/straight");
  trainAndCheckpoint(4, dir + "/split");
  const std::string written = dir + "/split/" + checkpointName(4);
  for (const char* file : {"trainer.json", "stage-0-replica-0-model.pt",
                           "stage-1-replica-0-optimizer.pt", "stage-1-replica-0-rng.pt"})
    EXPECT_TRUE(std::filesystem::exists(written + "/" + file)) << file;
  const auto resumed = trainAndCheckpoint(8, dir + "/split", "latest");
  ASSERT_EQ(resumed.size(), straight.size());
  EXPECT_TRUE(testing::bitwiseEqual(resumed, straight));
}

// Trains `ranks` threads of `job` with `settings` to `steps` (resuming from the checkpoint at
// `from` when given), checkpoints into `dir`, and returns the whole model (one replica: the
// stages in rank order).
std::vector<at::Tensor> trainLayout(const std::string& job, std::vector<std::string> settings,
                                    int ranks, std::int64_t steps, const std::string& dir,
                                    const std::string& from = "") {
  settings.push_back("checkpoint.dir=" + dir);
  std::vector<std::vector<at::Tensor>> per_rank(ranks);
  const auto errors = testing::runTrainers(job, settings, ranks, [&](Trainer& trainer, int rank) {
    if (!from.empty()) trainer.resume(from);
    while (trainer.nextStep() < steps) trainer.step();
    trainer.checkpoint();
    per_rank[rank] = testing::stageParametersOf(trainer);
  });
  for (const auto& error : errors) EXPECT_EQ(error, "");
  std::vector<at::Tensor> whole;
  for (const auto& stage : per_rank) whole.insert(whole.end(), stage.begin(), stage.end());
  return whole;
}

// A checkpoint of 2 stages goes on as 3 stages and as one data-parallel rank (what elastic
// recovery of a pipeline does with fewer or more devices): each rank reads its layers, values and
// optimizer state, from the stage files that hold them, and both end where 2 stages straight on
// do. The 3 stages run the same micro-batches in the same order (only where a layer runs moves),
// so they end bitwise there; the data-parallel rank takes the share in one pass, so its sums are
// in another order.
TEST(PipelineTrainer, ResumesACheckpointOnAnotherLayout) {
  const std::string dir = ::testing::TempDir() + "/chorus_pipeline_layout";
  std::filesystem::remove_all(dir);
  const std::vector<std::string> two = {"parallel.pipeline_stages=2", "devices=cpu,cpu"};
  const auto straight = trainLayout(kGptJob, two, 2, 8, dir + "/straight");
  trainLayout(kGptJob, two, 2, 4, dir + "/two");
  const std::string written = dir + "/two/" + checkpointName(4);
  const auto three = trainLayout(kGptJob, {"parallel.pipeline_stages=3", "devices=cpu,cpu,cpu"}, 3,
                                 8, dir + "/three", written);
  const auto one = trainLayout(kGptDataParallelJob, {"devices=cpu"}, 1, 8, dir + "/one", written);
  ASSERT_EQ(three.size(), straight.size());
  ASSERT_EQ(one.size(), straight.size());
  const double on_three = testing::maxRelativeDifference(three, straight);
  const double on_one = testing::maxRelativeDifference(one, straight);
  std::printf("max relative difference from 2 stages straight on: 3 stages %.3g, 1 rank %.3g\n",
              on_three, on_one);
  EXPECT_TRUE(testing::bitwiseEqual(three, straight));
  EXPECT_LT(on_one, 1e-5);
  // The data-parallel checkpoint goes back onto 2 stages, optimizer state and all, and the
  // consolidated model of a pipeline checkpoint has the data-parallel one's tensors.
  const std::string dp = dir + "/one/" + checkpointName(8);
  const auto back = trainLayout(kGptJob, two, 2, 10, dir + "/back", dp);
  const auto onward = trainLayout(kGptDataParallelJob, {"devices=cpu"}, 1, 10, dir + "/on", dp);
  ASSERT_EQ(back.size(), onward.size());
  EXPECT_LT(testing::maxRelativeDifference(back, onward), 1e-5);
  const std::string joined = dir + "/three.pt";
  EXPECT_EQ(consolidateCheckpoint(dir + "/three/" + checkpointName(8), joined),
            consolidateCheckpoint(dir + "/one/" + checkpointName(8), dir + "/one.pt"));
}

}  // namespace
}  // namespace chorus::runtime
