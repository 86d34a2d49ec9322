// Moving a pipeline's cut while it trains (parallel.recut; src/runtime/train/pipeline_recut.h):
// layers change stage with their parameters and optimizer state, and training goes on exactly as
// if the cut had never moved. Where the cut sits does not enter the math (every stage
// back-propagates sums; the optimizer steps each parameter alike wherever it lives), so the
// comparison is bitwise. Moves are forced with TrainerHooks::cut_at, so nothing here depends on
// timing. Ranks run as threads over one in-memory store.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "chorus/runtime/checkpoint/checkpoint.h"
#include "runtime/job_fixtures.h"
#include "runtime/trainer_threads.h"

namespace chorus::runtime {
namespace {

// A GPT of 6 layers (embedding, 4 blocks, head) on synthetic tokens, cut 3 + 3 at the start.
// SGD's momentum (0.9) is its default, not written: tests switch to optimizer.name=adamw.
const std::string kJob =
    testing::jobStart({.seed = 5, .balance = "off"},
                      {.steps = 12, .global_batch = 32, .eval_every = 0, .eval_samples = 64}) +
    testing::gptOnSynthetic({.layers = 4}) +
    testing::optimizerTable({.name = "sgd", .lr = 0.03, .warmup_steps = 2}) + R"([parallel]
micro_batches = 4
partition = "even"
)";

constexpr std::int64_t kSteps = 12;

struct Trained {
  std::vector<at::Tensor> parameters;  // the whole model's trainable parameters, in order
  std::vector<double> losses;
  std::vector<std::string> recuts;     // rank 0's StepRecord::recut, per step
  std::vector<std::vector<int>> cuts;  // rank 0's cut after each step
};

// Trains `steps` steps on stages x replicas threads, moving to moves[step] after `step`; with
// `resume`, resumes from that checkpoint first; with `checkpoint_at`, writes one after that step.
Trained train(int stages, int replicas, const std::vector<std::string>& extra,
              const std::map<std::int64_t, std::vector<int>>& moves, const std::string& resume = "",
              std::int64_t checkpoint_at = -1, std::int64_t steps = kSteps) {
  const int world = stages * replicas;
  std::vector<std::vector<at::Tensor>> per_rank(world);
  std::vector<std::vector<double>> losses(world);
  Trained result;
  std::vector<std::string> settings = {"parallel.pipeline_stages=" + std::to_string(stages),
                                       "parallel.replicas=" + std::to_string(replicas),
                                       world == 2 ? "devices=cpu,cpu" : "devices=cpu,cpu,cpu,cpu"};
  settings.insert(settings.end(), extra.begin(), extra.end());
  const auto errors = testing::runTrainers(kJob, settings, world, [&](Trainer& trainer, int rank) {
    TrainerHooks hooks;
    hooks.cut_at = [&moves](std::int64_t step) {
      const auto found = moves.find(step);
      return found == moves.end() ? std::vector<int>{} : found->second;
    };
    if (!resume.empty()) trainer.resume(resume);
    while (trainer.nextStep() < steps) {
      const StepRecord record = trainer.step(hooks);
      losses[rank].push_back(record.loss);
      if (rank == 0) {
        result.recuts.push_back(record.recut);
        result.cuts.push_back(trainer.cuts());
      }
      if (record.step == checkpoint_at) trainer.checkpoint();
    }
    per_rank[rank] = testing::stageParametersOf(trainer);
  });
  for (const auto& error : errors) EXPECT_EQ(error, "");
  for (int s = 0; s < stages; ++s)
    for (const auto& tensor : per_rank[s]) result.parameters.push_back(tensor);
  for (int rank = 1; rank < world; ++rank) {
    EXPECT_EQ(losses[rank], losses[0]) << "rank " << rank;
    if (rank >= stages)
      EXPECT_TRUE(testing::bitwiseEqual(per_rank[rank], per_rank[rank % stages]))
          << "rank " << rank;
  }
  result.losses = losses[0];
  return result;
}

void expectBitwiseEqual(const Trained& moved, const Trained& fixed) {
  ASSERT_EQ(moved.parameters.size(), fixed.parameters.size());
  EXPECT_TRUE(testing::bitwiseEqual(moved.parameters, fixed.parameters));
  EXPECT_EQ(moved.losses, fixed.losses);
}

// Two moves: two layers from stage 0 to stage 1, then four back the other way.
const std::map<std::int64_t, std::vector<int>> kMoves = {{3, {0, 1, 6}}, {7, {0, 5, 6}}};

TEST(PipelineRecut, MovingTheCutIsBitwiseTransparentWithSgdMomentum) {
  const Trained fixed = train(2, 1, {}, {});
  const Trained moved = train(2, 1, {}, kMoves);
  expectBitwiseEqual(moved, fixed);
  // The moves happened, and were said.
  EXPECT_EQ(moved.cuts[2], (std::vector<int>{0, 3, 6}));
  EXPECT_EQ(moved.cuts[3], (std::vector<int>{0, 1, 6}));
  EXPECT_EQ(moved.cuts.back(), (std::vector<int>{0, 5, 6}));
  EXPECT_NE(moved.recuts[3].find("cut 3+3 -> 1+5"), std::string::npos) << moved.recuts[3];
  EXPECT_NE(moved.recuts[7].find("cut 1+5 -> 5+1"), std::string::npos) << moved.recuts[7];
  EXPECT_TRUE(moved.recuts[0].empty());
}

TEST(PipelineRecut, MovingTheCutIsBitwiseTransparentWithAdamW) {
  const std::vector<std::string> adamw = {"optimizer.name=adamw", "optimizer.lr=0.01"};
  expectBitwiseEqual(train(2, 1, adamw, kMoves), train(2, 1, adamw, {}));
}

TEST(PipelineRecut, MovesEveryReplicaOfAHybridAlike) {
  // 2 replicas x 2 stages: the stage groups' all-reduce goes on over the same groups.
  const std::vector<std::string> gpipe = {"parallel.schedule=gpipe"};
  expectBitwiseEqual(train(2, 2, gpipe, kMoves), train(2, 2, gpipe, {}));
}

TEST(PipelineRecut, MovesAHybridOfFp16StagesWithACompressedAllReduce) {
  // The rebuilt engines keep the replicas' codec engine and stage group and re-hook the fp16
  // stages' unscalers. Activations cross in fp32 (a boundary in fp16 would round where the cut
  // is) and the codec keeps no residual (its buckets change with the cut): then a move is
  // transparent here too.
  const std::vector<std::string> mixed = {
      R"(precision.ranks=["fp16","fp16","fp16","fp16"])", "precision.loss_scale.init=1024",
      "parallel.activations=fp32", "comm.compression=bf16", "comm.error_feedback=false"};
  expectBitwiseEqual(train(2, 2, mixed, kMoves), train(2, 2, mixed, {}));
}

TEST(PipelineRecut, MovesAcrossMoreThanOneStage) {
  // Three stages from 2 + 2 + 2: layers 2-3 go from stage 1 to stage 0 and layer 4 from stage 2
  // to stage 1; then layer 1 from stage 0 to stage 1, layers 2-3 from stage 0 to stage 2 (past
  // stage 1) and layer 4 from stage 1 to stage 2.
  const std::map<std::int64_t, std::vector<int>> moves = {{2, {0, 4, 5, 6}}, {6, {0, 1, 2, 6}}};
  expectBitwiseEqual(train(3, 1, {"devices=cpu,cpu,cpu"}, moves),
                     train(3, 1, {"devices=cpu,cpu,cpu"}, {}));
}

TEST(PipelineRecut, ACheckpointAfterAMoveResumesOnTheMovedCut) {
  const std::string dir = ::testing::TempDir() + "/chorus_pipeline_recut_resume";
  std::filesystem::remove_all(dir);
  const std::vector<std::string> settings = {"optimizer.name=adamw", "optimizer.lr=0.01",
                                             "checkpoint.dir=" + dir};
  const Trained straight = train(2, 1, settings, kMoves);
  // The same run, checkpointed after step 5 (on cut 1 + 5), then resumed by new trainers that
  // start from the job's cut 3 + 3 and must take the checkpoint's.
  std::filesystem::remove_all(dir);
  train(2, 1, settings, kMoves, "", /*checkpoint_at=*/5, /*steps=*/6);
  const std::string written = dir + "/" + checkpointName(6);
  ASSERT_TRUE(std::filesystem::exists(written + "/trainer.json"));
  const Trained resumed = train(2, 1, settings, kMoves, written);
  EXPECT_EQ(resumed.cuts.front(), (std::vector<int>{0, 1, 6}));
  ASSERT_EQ(resumed.parameters.size(), straight.parameters.size());
  EXPECT_TRUE(testing::bitwiseEqual(resumed.parameters, straight.parameters));
}

TEST(PipelineRecut, RefusesAForcedCutThatIsNotACut) {
  const auto errors = testing::runTrainers(
      kJob, {"parallel.pipeline_stages=2", "devices=cpu,cpu"}, 2, [](Trainer& trainer, int) {
        TrainerHooks hooks;
        hooks.cut_at = [](std::int64_t) { return std::vector<int>{0, 6, 6}; };
        trainer.step(hooks);
      });
  for (const auto& error : errors)
    EXPECT_NE(error.find("TrainerHooks::cut_at gave cuts that do not split 6 layers into 2"),
              std::string::npos)
        << error;
}

TEST(PipelineRecut, DataParallelismRefusesTheCutHook) {
  std::string job = kJob;
  job = job.substr(0, job.find("[parallel]"));
  const auto errors = testing::runTrainers(job, {"devices=cpu"}, 1, [](Trainer& trainer, int) {
    TrainerHooks hooks;
    hooks.cut_at = [](std::int64_t) { return std::vector<int>{}; };
    trainer.step(hooks);
  });
  EXPECT_NE(errors[0].find("TrainerHooks::cut_at moves a pipeline's cut"), std::string::npos)
      << errors[0];
}

}  // namespace
}  // namespace chorus::runtime
