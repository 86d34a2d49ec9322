// The trainer over the bridge, with workers as processes: two agents on this machine play two
// nodes (host ids "node0" and "node1") of two CPU workers each. Each node's pair reduces its
// gradients over shared memory, the two leaders meet over Gloo (declared hosts share no memory),
// and the job must train as single-process training on the same global batches does: every
// step's loss within 1e-6 relative (reduction order only).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <thread>

#include "runtime/chorus_cli.h"

namespace chorus::testing {
namespace {

// A small MLP on synthetic data, equal split, fp32, fixed seed: the losses depend only on the
// global batches.
const std::string kJob =
    " --set balance=off --set seed=3 --set model.kind=mlp --set model.hidden=[64]"
    " --set data.dataset=synthetic --set data.size=1024 --set train.steps=8"
    " --set train.global_batch=32 --set train.eval_every=0 --set train.eval_samples=64"
    " --set train.target_accuracy=0 --set optimizer.schedule=constant";
constexpr size_t kSteps = 8;

std::vector<double> lossesOf(const TrainRun& run) {
  std::vector<double> losses;
  for (const auto& step : run.steps) losses.push_back(step["loss"].get<double>());
  return losses;
}

// The job as two nodes of `devices` on this machine; returns node 0's run.
TrainRun onTwoNodes(const std::string& devices, const std::string& settings,
                    const std::string& name, int port) {
  const std::string secret = ::testing::TempDir() + "/bridge.secret";
  { std::ofstream(secret) << "bridge-trainer-test-secret-0123456789"; }
  EXPECT_EQ(chmod(secret.c_str(), 0600), 0);
  const std::string common = " --set devices=" + devices + kJob + settings +
                             " --nnodes 2 --rdzv-endpoint 127.0.0.1:" + std::to_string(port) +
                             " --secret-file " + secret;
  CommandResult node1;
  std::thread second(
      [&] { node1 = runCommand(std::string(CHORUS_BINARY) + " train --node-rank 1" + common); });
  TrainRun node0 = chorusTrain("--node-rank 0" + common, name);
  second.join();
  EXPECT_EQ(node1.exit_code, 0) << node1.output;
  return node0;
}

void expectSameLosses(const std::vector<double>& bridged, const std::vector<double>& single) {
  ASSERT_EQ(bridged.size(), kSteps);
  ASSERT_EQ(single.size(), kSteps);
  double largest = 0;
  for (size_t step = 0; step < kSteps; ++step) {
    EXPECT_NEAR(bridged[step], single[step], 1e-6 * std::abs(single[step])) << "step " << step + 1;
    largest = std::max(largest, std::abs(bridged[step] - single[step]) / std::abs(single[step]));
  }
  std::printf("largest relative loss difference to one process: %.3g\n", largest);
}

TEST(BridgeTrainerMultiproc, TwoShmGroupsJoinedByGlooTrainAsOneProcess) {
  const TrainRun single = chorusTrain("--set devices=cpu" + kJob, "bridge_single");
  ASSERT_EQ(single.exit_code, 0) << single.output;
  const int port = 29000 + static_cast<int>(getpid() % 400);
  int offset = 0;
  for (const char* algorithm : {"hierarchical", "2d"}) {
    const TrainRun run = onTwoNodes("cpu,cpu", std::string(" --set comm.algorithm=") + algorithm,
                                    std::string("bridge_") + algorithm, port + offset++);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find(std::string("gradient all-reduce: ") + algorithm +
                              " over 4 ranks in 2 groups {0,1} {2,3}"),
              std::string::npos)
        << run.output;
    EXPECT_NE(run.output.find("(rank 0: local shm, leaders gloo)"), std::string::npos)
        << run.output;
    expectSameLosses(lossesOf(run), lossesOf(single));
  }
}

}  // namespace
}  // namespace chorus::testing
