// The trainer's gradient buckets and its emulation of slower devices as the compute goes: every
// model of the zoo gets several buckets, so all-reduces overlap backward; an emulated rank pads
// after each forward and before each bucket's launch, not only at the end of its compute; the
// overlap changes no number. Ranks are threads over one in-memory store. Counts of pad points are
// asserted, never times, so the tests hold on a loaded host.
#include <gtest/gtest.h>

#include "chorus/comm/communicator.h"
#include "chorus/comm/store/memory_store.h"
#include "chorus/model/model_config.h"
#include "chorus/model/zoo_model.h"
#include "chorus/parallel/gradient_reducer.h"
#include "runtime/job_fixtures.h"
#include "runtime/trainer_threads.h"

namespace chorus::runtime {
namespace {

// The buckets the default ReducerOptions give the zoo model of `kind` (its default config).
int bucketsOfZooModel(const std::string& kind) {
  model::ModelConfig config;
  config.kind = kind;
  auto zoo = model::makeModel(config, 1);
  std::vector<at::Tensor> parameters;
  for (const auto& parameter : zoo->parameters())
    parameters.push_back(parameter.detach().clone().requires_grad_(true));
  auto world = comm::Communicator::create(std::make_shared<comm::MemoryStore>(), 0, 1);
  return parallel::GradientReducer(parameters, world).numBuckets();
}

TEST(TrainerOverlap, EveryZooModelGetsSeveralBuckets) {
  // With DDP's sizes alone (1 MiB, then 25 MiB) each of these is one or two buckets. The MLP's
  // first weight holds 85% of its gradient, which no cap below it can split.
  EXPECT_GE(bucketsOfZooModel("mlp"), 2);
  EXPECT_GE(bucketsOfZooModel("cnn"), 4);
  EXPECT_GE(bucketsOfZooModel("gpt"), 4);
}

const std::string kJob =
    testing::jobStart({.seed = 3, .balance = "off"},
                      {.steps = 3, .global_batch = 32, .eval_every = 0, .eval_samples = 32}) +
    testing::mlpOnSynthetic({.hidden = "[128, 64]", .size = 512}) +
    testing::optimizerTable({.name = "sgd", .lr = 0.05});

constexpr int kSteps = 3;

struct Trained {
  std::vector<at::Tensor> parameters;  // rank 0's
  std::int64_t pad_points = 0;         // of the emulated rank 0
  std::int64_t phases = 0;
};

// Rank 0 emulates a device at half speed (the trainer's test hook), rank 1 runs at full speed.
Trained train(const std::vector<std::string>& settings) {
  Trained run;
  TrainerHooks slow;
  slow.speed_at = [](std::int64_t) { return 0.5; };
  const auto errors = testing::runTrainers(kJob, settings, 2, [&](Trainer& t, int rank) {
    for (int step = 0; step < kSteps; ++step) t.step(rank == 0 ? slow : TrainerHooks{});
    if (rank != 0) return;
    run.parameters = testing::parametersOf(t);
    run.pad_points = t.emulationTotals().pad_points;
    run.phases = t.emulationTotals().phases;
  });
  for (const auto& error : errors) EXPECT_EQ(error, "");
  return run;
}

TEST(TrainerOverlap, AnEmulatedRankReleasesEachBucketAtTheEmulatedPace) {
  const Trained on = train({"comm.overlap=true"});
  const Trained off = train({"comm.overlap=false"});
  // One micro-batch per step: one phase...
  EXPECT_EQ(on.phases, kSteps);
  // ...whose buckets, with overlap, are held back by the hooks and each released at its emulated
  // moment: the same number every step (this MLP has several). Without overlap they go out after
  // the phase, with nothing to release inside it.
  EXPECT_EQ(off.pad_points, 0);
  EXPECT_EQ(on.pad_points % kSteps, 0);
  EXPECT_GE(on.pad_points / kSteps, 3);
  // Launching during backward or after it reduces the same buckets: the same model, bit for bit.
  EXPECT_TRUE(testing::bitwiseEqual(on.parameters, off.parameters));
}

TEST(TrainerOverlap, BucketKeysShapeTheBuckets) {
  // DDP's rule alone with a 25 MiB cap: this 67 KiB MLP is one bucket, released once a step.
  const Trained ddp = train({"comm.min_buckets=1"});
  EXPECT_EQ(ddp.pad_points, kSteps);
  // A first bucket of 1 KiB and later ones of 40 KiB split it into more, as many every step.
  const Trained small =
      train({"comm.min_buckets=1", "comm.first_bucket_mb=0.001", "comm.bucket_mb=0.04"});
  EXPECT_GT(small.pad_points, ddp.pad_points);
  EXPECT_EQ(small.pad_points % kSteps, 0);
  EXPECT_TRUE(testing::bitwiseEqual(small.parameters, ddp.parameters));
}

}  // namespace
}  // namespace chorus::runtime
