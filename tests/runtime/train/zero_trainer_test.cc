// ZeRO stages 1 to 3 in the Trainer: the same model as replicated data parallelism (stage 0)
// after 20 steps of the GPT with uneven batch shares and uneven shards, with SGD and AdamW and
// with an fp16 rank; shards sized by memory; exact and resharded resume; what [zero] refuses.
// Ranks run as threads over one in-memory store.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include <torch/serialize.h>

#include "chorus/core/config.h"
#include "chorus/core/error.h"
#include "chorus/runtime/checkpoint/checkpoint.h"
#include "chorus/runtime/job/job_plan.h"
#include "runtime/job_fixtures.h"
#include "runtime/trainer_threads.h"

namespace chorus::runtime {
namespace {

// SGD's momentum (0.9) is its default, not written: tests switch to optimizer.name=adamw.
const std::string kGptJob =
    testing::jobStart(
        {.seed = 3, .balance = "off"},
        {.steps = 20, .global_batch = 64, .micro_batch = 8, .eval_every = 0, .eval_samples = 64}) +
    testing::kTinyGpt + testing::optimizerTable({.name = "sgd", .lr = 0.03}) + R"([comm]
bucket_mb = 0.01
)";

const std::string kShares = "balancer.shares=[5,17,42]";
// Unlike slices, independent of the shares: the largest share gets the smallest slice.
const std::string kShards = "zero.shards=[0.5,0.3,0.2]";

// Rank 0's parameters after `steps` steps of the GPT on three ranks with `settings`; every rank
// must hold the same ones.
std::vector<at::Tensor> train(const std::vector<std::string>& settings, int steps = 20,
                              int world = 3) {
  std::vector<std::vector<at::Tensor>> results(world);
  const auto errors = testing::runTrainers(kGptJob, settings, world, [&](Trainer& t, int rank) {
    while (t.nextStep() < steps) t.step();
    results[rank] = t.parameterValues();  // collective under ZeRO-3
  });
  for (int rank = 0; rank < world; ++rank) EXPECT_EQ(errors[rank], "") << "rank " << rank;
  for (int rank = 1; rank < world; ++rank)
    EXPECT_TRUE(testing::bitwiseEqual(results[rank], results[0])) << "rank " << rank << " differs";
  return results[0];
}

void expectAsStageZero(const std::vector<std::string>& extra, double tolerance) {
  std::vector<std::string> base{kShares};
  base.insert(base.end(), extra.begin(), extra.end());
  const auto replicated = train(base);
  for (const char* stage : {"1", "2", "3"}) {
    std::vector<std::string> settings = base;
    settings.push_back(std::string("zero.stage=") + stage);
    settings.push_back(kShards);
    const auto sharded = train(settings);
    ASSERT_EQ(sharded.size(), replicated.size());
    const double difference = testing::maxRelativeDifference(sharded, replicated);
    std::printf("ZeRO stage %s against stage 0: max relative parameter difference %.3g\n", stage,
                difference);
    EXPECT_LT(difference, tolerance) << "stage " << stage;
  }
}

// Stage 3 runs as many micro-batches on every rank (each pass gathers every layer from all of
// them): the largest share's six of at most 8 samples, so the two smaller shares sum their
// gradients in other pieces than stage 0 does, a last-bit difference.
TEST(ZeroTrainer, StagesOneToThreeTrainAsStageZeroWithSgd) { expectAsStageZero({}, 1e-6); }

// AdamW divides by the root of its second moment, which magnifies the last bit of a gradient
// summed in another order; stage 0 itself differs from one process by up to 1e-5 on this job
// (TrainerEquivalence), the bound here.
TEST(ZeroTrainer, StagesOneToThreeTrainAsStageZeroWithAdamW) {
  expectAsStageZero({"optimizer.name=adamw", "optimizer.lr=0.003"}, 1e-5);
}

TEST(ZeroTrainer, StagesOneToThreeTrainAsStageZeroWithAnFp16Rank) {
  expectAsStageZero({"precision.ranks=[\"fp32\",\"fp16\",\"fp32\"]"}, 1e-6);
}

// A bf16 codec on stage 2's and 3's reduce-scatter (x/n in bf16, summed in bf16) trains as the
// same codec on stage 0's all-reduce does, and differs from the uncompressed run: the codec ran.
TEST(ZeroTrainer, StagesTwoAndThreeCompressTheirReduceScatterAsStageZeroItsAllReduce) {
  const std::vector<std::string> base{kShares, "comm.compression=bf16"};
  const auto replicated = train(base);
  const double uncompressed = testing::maxRelativeDifference(train({kShares}), replicated);
  for (const char* stage : {"2", "3"}) {
    std::vector<std::string> settings = base;
    settings.push_back(std::string("zero.stage=") + stage);
    settings.push_back(kShards);
    const double difference = testing::maxRelativeDifference(train(settings), replicated);
    std::printf(
        "ZeRO stage %s with bf16 against stage 0 with bf16: %.3g (stage 0 uncompressed: "
        "%.3g)\n",
        stage, difference, uncompressed);
    EXPECT_LT(difference, 1e-6) << "stage " << stage;  // 0 on this host: the same sums in bf16
  }
}

// Shards by memory: the plan gives each device a fraction of what its budget leaves after its
// replicated part, so the larger budget gets the larger slice, and all of them fit.
TEST(ZeroTrainer, MemoryShardsFollowTheBudgets) {
  Config config = Config::parseString(kGptJob);
  config.set("zero.stage=2");
  const JobConfig job = readJobConfig(config);
  const auto devices = parseDeviceSpecs("cpu/600MiB,cpu/300MiB,cpu/400MiB");
  const plan::Plan plan = planOfJob(job, devices);
  ASSERT_EQ(plan.zero_shards.size(), 3u);
  EXPECT_GT(plan.zero_shards[0], plan.zero_shards[2]);
  EXPECT_GT(plan.zero_shards[2], plan.zero_shards[1]);
  EXPECT_NEAR(plan.zero_shards[0] + plan.zero_shards[1] + plan.zero_shards[2], 1.0, 1e-9);
  // Without budgets there is nothing to size by: even.
  EXPECT_TRUE(planOfJob(job, parseDeviceSpecs("cpu,cpu,cpu")).zero_shards.empty());
  // Budgets on some devices only: refused, naming the key.
  try {
    planOfJob(job, parseDeviceSpecs("cpu/600MiB,cpu,cpu"));
    FAIL() << "accepted budgets on some devices only";
  } catch (const ConfigError& error) {
    EXPECT_NE(error.message().find("zero.shards"), std::string::npos) << error.message();
  }
}

std::string freshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/chorus_zero_" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

// `steps` steps on `world` ranks with `settings` (AdamW unless they name an optimizer), resuming
// from `resume` when given, then a checkpoint; rank 0's parameters.
std::vector<at::Tensor> trainAndCheckpoint(std::vector<std::string> settings, int world, int steps,
                                           const std::string& dir, const std::string& resume = "") {
  settings.push_back("checkpoint.dir=" + dir);
  if (std::none_of(settings.begin(), settings.end(), [](const std::string& setting) {
        return setting.rfind("optimizer.name=", 0) == 0;
      })) {
    settings.push_back("optimizer.name=adamw");
    settings.push_back("optimizer.lr=0.003");
  }
  std::vector<at::Tensor> result;
  const auto errors = testing::runTrainers(kGptJob, settings, world, [&](Trainer& t, int rank) {
    if (!resume.empty()) t.resume(resolveCheckpoint(resume, dir));
    while (t.nextStep() < steps) t.step();
    t.checkpoint();
    auto values = t.parameterValues();  // collective under ZeRO-3
    if (rank == 0) result = std::move(values);
  });
  for (const auto& error : errors) EXPECT_EQ(error, "");
  return result;
}

TEST(ZeroTrainer, ResumeOnTheSameShardsIsBitwiseExact) {
  for (const char* stage : {"zero.stage=2", "zero.stage=3"}) {
    const std::vector<std::string> settings{kShares, stage, kShards};
    const auto straight = trainAndCheckpoint(settings, 3, 12, freshDir("straight"));
    const std::string dir = freshDir("interrupted");
    trainAndCheckpoint(settings, 3, 5, dir);
    const auto resumed = trainAndCheckpoint(settings, 3, 12, dir, "latest");
    ASSERT_FALSE(straight.empty());
    EXPECT_TRUE(testing::bitwiseEqual(resumed, straight))
        << stage << ": max relative difference "
        << testing::maxRelativeDifference(resumed, straight);
  }
}

// 3 ranks with uneven shards to 2 ranks with even ones, stage 1 to stage 2: the slices are put
// together and cut anew. The resumed run must follow the replicated run resumed the same way
// (stage 0, 3 ranks to 2) as closely as stage 2 follows stage 0 in one run, and the uninterrupted
// run as closely as that replicated resume does (the two ranks sum the gradient in another
// order, which AdamW magnifies).
TEST(ZeroTrainer, ResumeOnTwoRanksReshardsTheOptimizerState) {
  const std::string replicated_dir = freshDir("replicated_three_to_two");
  trainAndCheckpoint({}, 3, 5, replicated_dir);
  const auto replicated = trainAndCheckpoint({}, 2, 12, replicated_dir, "latest");
  // Stage 1 to stage 2 (the slices put together and cut anew), and stage 3 to stage 3 (each rank
  // reads the parts of the saved slices that overlap its new one).
  for (const auto& [before, after] : std::vector<std::pair<std::string, std::string>>{
           {"zero.stage=1", "zero.stage=2"}, {"zero.stage=3", "zero.stage=3"}}) {
    const std::vector<std::string> three{before, kShards};
    const auto straight = trainAndCheckpoint(three, 3, 12, freshDir("straight3"));
    const std::string dir = freshDir("three_to_two");
    trainAndCheckpoint(three, 3, 5, dir);
    const auto resharded = trainAndCheckpoint({after}, 2, 12, dir, "latest");
    const double against_replicated = testing::maxRelativeDifference(resharded, replicated);
    const double against_straight = testing::maxRelativeDifference(resharded, straight);
    const double replicated_against_straight = testing::maxRelativeDifference(replicated, straight);
    std::printf(
        "ZeRO 3 ranks (%s) -> 2 ranks (%s), resharded: max relative parameter difference %.3g "
        "against the replicated resume, %.3g against the uninterrupted run (replicated resume: "
        "%.3g)\n",
        before.c_str(), after.c_str(), against_replicated, against_straight,
        replicated_against_straight);
    EXPECT_LT(against_replicated, 1e-6) << before;
    EXPECT_LT(against_straight, 2 * replicated_against_straight + 1e-6) << before;
  }
  // With SGD, whose update does not magnify the last bit of a gradient summed in another order,
  // the resharded ZeRO-3 resume is within 1e-5 of the uninterrupted run.
  const std::vector<std::string> sgd{"zero.stage=3", kShards, "optimizer.name=sgd"};
  const auto straight = trainAndCheckpoint(sgd, 3, 12, freshDir("straight_sgd"));
  const std::string dir = freshDir("three_to_two_sgd");
  trainAndCheckpoint(sgd, 3, 5, dir);
  const auto resharded =
      trainAndCheckpoint({"zero.stage=3", "optimizer.name=sgd"}, 2, 12, dir, "latest");
  const double difference = testing::maxRelativeDifference(resharded, straight);
  std::printf("ZeRO-3 with SGD, 3 ranks -> 2 ranks: %.3g from the uninterrupted run\n", difference);
  EXPECT_LT(difference, 1e-5);
}

// The optimizer's state goes from one kind of job to the other, and across bucket sizes (which
// set ZeRO's flat order): each resume is bitwise the uninterrupted replicated run, since ZeRO
// changes nothing but where the optimizer computes.
TEST(ZeroTrainer, CheckpointsMoveBetweenReplicatedAndShardedJobs) {
  const auto straight = trainAndCheckpoint({kShares}, 3, 12, freshDir("straight_replicated"));
  const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> cases{
      {{kShares}, {kShares, "zero.stage=2", kShards}},
      {{kShares, "zero.stage=1", kShards}, {kShares}},
      {{kShares, "zero.stage=2", kShards}, {kShares, "zero.stage=1", "comm.bucket_mb=25"}},
  };
  int index = 0;
  for (const auto& [before, after] : cases) {
    const std::string dir = freshDir("moved" + std::to_string(index++));
    trainAndCheckpoint(before, 3, 5, dir);
    const auto resumed = trainAndCheckpoint(after, 3, 12, dir, "latest");
    EXPECT_TRUE(testing::bitwiseEqual(resumed, straight))
        << "case " << index << ": max relative difference "
        << testing::maxRelativeDifference(resumed, straight);
  }
}

// The same for ZeRO-3, whose checkpoint holds the parameters in slices and no model file. With one
// micro-batch per rank (micro_batch 64), stage 3 sums each gradient as stage 0 does.
TEST(ZeroTrainer, CheckpointsMoveBetweenStageThreeAndOtherJobs) {
  const std::string one_pass = "train.micro_batch=64";
  const auto straight =
      trainAndCheckpoint({kShares, one_pass}, 3, 12, freshDir("straight_one_pass"));
  const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> cases{
      {{kShares, one_pass, "zero.stage=3", kShards}, {kShares, one_pass}},
      {{kShares, one_pass}, {kShares, one_pass, "zero.stage=3"}},
      {{kShares, one_pass, "zero.stage=1", kShards},
       {kShares, one_pass, "zero.stage=3", "comm.bucket_mb=25"}},
      {{kShares, one_pass, "zero.stage=3", kShards}, {kShares, one_pass, "zero.stage=2"}},
  };
  int index = 0;
  for (const auto& [before, after] : cases) {
    const std::string dir = freshDir("moved3_" + std::to_string(index++));
    trainAndCheckpoint(before, 3, 5, dir);
    EXPECT_EQ(std::filesystem::exists(dir + "/step-00000005/model.pt"),
              std::find(before.begin(), before.end(), "zero.stage=3") == before.end())
        << "case " << index << ": a ZeRO-3 checkpoint has no model file, the others one";
    const auto resumed = trainAndCheckpoint(after, 3, 12, dir, "latest");
    EXPECT_TRUE(testing::bitwiseEqual(resumed, straight))
        << "case " << index << ": max relative difference "
        << testing::maxRelativeDifference(resumed, straight);
  }
}

// The tensors of a model archive (model.pt), by name.
std::map<std::string, at::Tensor> modelFile(const std::string& path) {
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  std::map<std::string, at::Tensor> tensors;
  for (const std::string& key : archive.keys()) archive.read(key, tensors[key]);
  return tensors;
}

// `chorus checkpoint consolidate`: a ZeRO-3 checkpoint's slices make the model.pt that the same
// run replicated writes, bit for bit; a replicated checkpoint's model.pt is copied.
TEST(ZeroTrainer, ConsolidatedStageThreeCheckpointIsTheReplicatedModelFile) {
  const std::string one_pass = "train.micro_batch=64";
  const std::string sharded = freshDir("consolidate_sharded");
  const std::string replicated = freshDir("consolidate_replicated");
  trainAndCheckpoint({kShares, one_pass, "zero.stage=3", kShards}, 3, 5, sharded);
  trainAndCheckpoint({kShares, one_pass}, 3, 5, replicated);
  const std::string from_slices = freshDir("consolidated_sharded.pt");
  const std::string copied = freshDir("consolidated_replicated.pt");
  EXPECT_EQ(consolidateCheckpoint(resolveCheckpoint("latest", sharded), from_slices),
            2 + 12 * 2 + 3);
  EXPECT_EQ(consolidateCheckpoint(resolveCheckpoint("latest", replicated), copied), 2 + 12 * 2 + 3);
  const auto a = modelFile(from_slices), b = modelFile(copied);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, tensor] : b) {
    ASSERT_EQ(a.count(name), 1u) << name;
    EXPECT_TRUE(at::equal(a.at(name), tensor)) << name;
  }
  // A directory that holds no checkpoint: refused, naming it.
  try {
    consolidateCheckpoint(freshDir("not_a_checkpoint"), copied);
    ADD_FAILURE() << "consolidated a missing checkpoint";
  } catch (const CheckpointError& error) {
    EXPECT_NE(error.message().find("not_a_checkpoint"), std::string::npos) << error.message();
  }
}

// Each bad [zero] is refused with one ConfigError naming the key, when the job is read.
TEST(ZeroTrainer, BadZeroSettingsAreRefusedNamingTheKey) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases{
      {{"zero.stage=4"}, "zero.stage"},
      {{"zero.shards=\"even\""}, "zero.shards"},  // without a stage
      {{"zero.stage=1", "zero.shards=\"fast\""}, "zero.shards"},
      {{"zero.stage=1", "zero.shards=[0.5,0.6]"}, "zero.shards"},
      {{"zero.stage=1", "zero.shards=[1.5,-0.5]"}, "zero.shards"},
      {{"zero.stage=1", "devices=cpu,cpu,cpu", "zero.shards=[0.5,0.5]"}, "zero.shards"},
      {{"zero.stage=2", "comm.compression=int8"}, "comm.compression"},
      {{"zero.stage=2", "comm.algorithm=hierarchical"}, "comm.algorithm"},
      {{"zero.stage=1", "comm.sync_every=4"}, "comm.sync_every"},
      {{"zero.stage=1", "devices=cpu,cpu", "train.micro_batch=0", "parallel.pipeline_stages=2"},
       "parallel.pipeline_stages"},
  };
  for (const auto& [settings, key] : cases) {
    Config config = Config::parseString(kGptJob);
    for (const auto& setting : settings) config.set(setting);
    try {
      readJobConfig(config);
      ADD_FAILURE() << "accepted " << settings.back();
    } catch (const ConfigError& error) {
      EXPECT_NE(error.message().find("'" + key + "'"), std::string::npos)
          << settings.back() << ": " << error.message();
    }
  }
}

}  // namespace
}  // namespace chorus::runtime
