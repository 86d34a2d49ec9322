// The trainer over topology-aware communication: hierarchical all-reduce across emulated hosts,
// gradient compression where gradients cross hosts, and local SGD. Ranks are threads over one
// in-memory store; CHORUS_HOST_ID makes them "hosts".
#include <gtest/gtest.h>

#include "runtime/job_fixtures.h"
#include "runtime/trainer_threads.h"

namespace chorus::runtime {
namespace {

const std::string kJob =
    testing::jobStart({.seed = 5, .balance = "off"},
                      {.steps = 10, .global_batch = 64, .eval_every = 0, .eval_samples = 64}) +
    testing::mlpOnSynthetic({.hidden = "[128, 64]", .size = 2048}) +
    testing::optimizerTable({.name = "sgd", .lr = 0.05, .momentum = 0.9});

const std::vector<std::string> kTwoHosts{"host-a", "host-a", "host-b", "host-b"};

// Every rank's parameters after `steps` steps, and the loss of the last step.
struct TrainedRanks {
  std::vector<std::vector<at::Tensor>> ranks;
  double last_loss = 0;
};

TrainedRanks train(const std::vector<std::string>& settings, int steps,
                   const std::vector<std::string>& hosts = kTwoHosts) {
  TrainedRanks run;
  run.ranks.resize(hosts.size());
  const auto errors = testing::runTrainers(
      kJob, settings, static_cast<int>(hosts.size()),
      [&](Trainer& t, int rank) {
        double loss = 0;
        for (int step = 0; step < steps; ++step) loss = t.step().loss;
        run.ranks[rank] = testing::parametersOf(t);
        if (rank == 0) run.last_loss = loss;
      },
      hosts);
  for (const auto& error : errors) EXPECT_EQ(error, "");
  return run;
}

void expectReplicasIdentical(const TrainedRanks& run) {
  for (size_t rank = 1; rank < run.ranks.size(); ++rank)
    EXPECT_TRUE(testing::bitwiseEqual(run.ranks[rank], run.ranks[0]))
        << "rank " << rank << " diverged";
}

TEST(TrainerComm, HierarchicalAndTwoDimensionalAllReduceTrainLikeFlat) {
  const TrainedRanks flat = train({}, 10);
  for (const char* algorithm : {"hierarchical", "2d"}) {
    const TrainedRanks run = train({std::string("comm.algorithm=") + algorithm}, 10);
    expectReplicasIdentical(run);
    const double difference = testing::maxRelativeDifference(run.ranks[0], flat.ranks[0]);
    std::printf("%s vs flat: max relative parameter difference %.3g\n", algorithm, difference);
    EXPECT_LT(difference, 1e-5) << algorithm;
  }
}

TEST(TrainerComm, CompressionAcrossHostsKeepsReplicasIdenticalAndTrains) {
  const TrainedRanks plain = train({"comm.algorithm=hierarchical"}, 10);
  for (const char* codec : {"fp16", "int8", "powersgd"}) {
    const TrainedRanks run =
        train({"comm.algorithm=hierarchical", std::string("comm.compression=") + codec}, 10);
    expectReplicasIdentical(run);
    const double difference = testing::maxRelativeDifference(run.ranks[0], plain.ranks[0]);
    std::printf("%s: last loss %.4f (uncompressed %.4f), parameter difference %.3g\n", codec,
                run.last_loss, plain.last_loss, difference);
    EXPECT_GT(difference, 0.0) << codec << " changed nothing: was it applied?";
    EXPECT_LT(run.last_loss, 1.1 * plain.last_loss) << codec;
  }
}

TEST(TrainerComm, LocalSgdAveragesParametersEveryNSteps) {
  const TrainedRanks between = train({"comm.sync_every=4"}, 6);
  EXPECT_FALSE(testing::bitwiseEqual(between.ranks[1], between.ranks[0]))
      << "ranks with different data should differ between averages";
  const TrainedRanks at_sync = train({"comm.sync_every=4"}, 8);
  for (size_t rank = 1; rank < at_sync.ranks.size(); ++rank)
    EXPECT_LT(testing::maxRelativeDifference(at_sync.ranks[rank], at_sync.ranks[0]), 1e-6)
        << "rank " << rank << " after an average";
}

// An fp16 overflow on one rank makes that step's compressed all-reduce non-finite on every rank;
// the codecs must not carry it in their memory (error-feedback residuals, PowerSGD's warm Q), or
// every later step would overflow too and be skipped.
TEST(TrainerComm, ACodecForgetsAnOverflowedStep) {
  // The last: ZeRO-2's compressed reduce-scatter, where each rank sees only its slice of the sum.
  for (const std::string codec : {"bf16", "int8", "powersgd", "bf16 zero.stage=2"}) {
    std::vector<std::int64_t> skipped;
    std::vector<std::string> settings = {
        "devices=cpu,cpu", R"(precision.ranks=["fp16","fp32"])", "precision.loss_scale.init=1024",
        "comm.compression=" + codec.substr(0, codec.find(' ')), "comm.powersgd_start_step=0"};
    if (codec.find(' ') != std::string::npos) settings.push_back(codec.substr(codec.find(' ') + 1));
    const auto errors = testing::runTrainers(kJob, settings, 2,
                                             [&](Trainer& trainer, int rank) {
                                               TrainerHooks hooks;
                                               hooks.inject_overflow = [rank](std::int64_t step) {
                                                 return rank == 1 && step == 2;
                                               };
                                               for (std::int64_t step = 0; step < 6; ++step)
                                                 if (trainer.step(hooks).skipped && rank == 0)
                                                   skipped.push_back(step);
                                             },
                                             {"host-a", "host-b"});
    for (const auto& error : errors) EXPECT_EQ(error, "") << codec;
    EXPECT_EQ(skipped, (std::vector<std::int64_t>{2})) << codec;
  }
}

}  // namespace
}  // namespace chorus::runtime
