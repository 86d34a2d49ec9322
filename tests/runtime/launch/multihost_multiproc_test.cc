// Several hosts for real: two network namespaces joined by a bridge, one link shaped to 1 Gbit/s
// (scripts/netns_hosts), one `chorus train` agent in each with two CPU workers. The job must train
// exactly as the same job with four workers on one host, and its gradients must cross the link.
//
// Needs root and `ip netns`; skips (naming the reason) without them.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "chorus_version.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

// scripts/netns_hosts under the source root (from the build, not __FILE__: a compiler cache may
// make that relative).
std::string netnsScript() { return std::string(CHORUS_SOURCE_DIR) + "/scripts/netns_hosts"; }

// Why the namespaces cannot be made here, or "" when they can.
std::string whyUnavailable() {
  if (geteuid() != 0) return "needs root to create network namespaces";
  if (std::system("ip netns list >/dev/null 2>&1") != 0) return "`ip netns` is unavailable";
  if (access(netnsScript().c_str(), X_OK) != 0) return netnsScript() + " is missing";
  return "";
}

int exitCode(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }

std::string readFile(const std::string& path) {
  std::ifstream file(path);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

std::vector<double> losses(const std::string& log) {
  std::vector<double> values;
  std::ifstream lines(log);
  std::string line;
  while (std::getline(lines, line)) values.push_back(nlohmann::json::parse(line)["loss"]);
  return values;
}

// Two hosts "<prefix>-h0/h1" for the whole suite; destroyed at the end.
class MultihostMultiproc : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    skip_reason_ = whyUnavailable();
    if (!skip_reason_.empty()) return;
    prefix_ = "cmt" + std::to_string(getpid() % 100000);
    // Root with `ip netns` has what the hosts need: a create that fails there is a failure of
    // every test, not a skip.
    const std::string log = testing::TempDir() + "/" + prefix_ + "-create.log";
    const std::string create = netnsScript() + " create 2 --rate 1gbit --shaped 0 --prefix " +
                               prefix_ + " >" + log + " 2>&1";
    if (std::system(create.c_str()) != 0)
      setup_failure_ = "scripts/netns_hosts create failed:\n" + readFile(log);
  }
  static void TearDownTestSuite() {
    if (!prefix_.empty()) std::system((netnsScript() + " destroy --prefix " + prefix_).c_str());
  }
  void SetUp() override {
    if (!skip_reason_.empty()) GTEST_SKIP() << skip_reason_;
    ASSERT_TRUE(setup_failure_.empty()) << setup_failure_;
  }

 public:
  // `command` inside host `host`, its output to `output`; returns the exit code.
  static int inHost(int host, const std::string& command, const std::string& output) {
    const std::string line = netnsScript() + " exec " + std::to_string(host) + " --prefix " +
                             prefix_ + " -- " + command + " >" + output + " 2>&1";
    return exitCode(std::system(line.c_str()));
  }
  // Bytes host 0's link has sent so far.
  static std::uint64_t linkTxBytes() {
    const std::string out = testing::TempDir() + "/" + prefix_ + "-tx";
    inHost(0, "cat /sys/class/net/eth0/statistics/tx_bytes", out);
    return std::stoull(readFile(out));
  }

 protected:
  static std::string skip_reason_;
  static std::string setup_failure_;
  static std::string prefix_;
};

std::string MultihostMultiproc::skip_reason_;
std::string MultihostMultiproc::setup_failure_;
std::string MultihostMultiproc::prefix_;

// A small MLP on synthetic data, equal split, fixed seed: the loss sequence depends only on the
// global batches, not on where the four workers run.
const std::string kJob =
    " --set balance=off --set seed=3 --set model.kind=mlp --set model.hidden=[64]"
    " --set data.dataset=synthetic --set data.size=1024 --set train.steps=8"
    " --set train.global_batch=32 --set train.eval_every=0 --set train.eval_samples=64"
    " --set train.target_accuracy=0 --set train.log_every=4 --set optimizer.schedule=constant";
constexpr int kSteps = 8;
// MLP 784 -> 64 -> 10: the bytes of its fp32 gradient.
constexpr std::uint64_t kGradientBytes = 4 * (784 * 64 + 64 + 64 * 10 + 10);

// What a job of two nodes (one per host) did: node 0's output, the bytes host 0's link sent,
// and the losses of node 0's --log-json.
struct TwoHostRun {
  std::string out0;
  std::uint64_t crossed = 0;
  std::vector<double> losses;
};

// `chorus train --set devices=cpu,cpu <job>` as node 0 on host 0 and node 1 on host 1, with a
// fresh secret in `dir`; the two node exits must be 0.
TwoHostRun runOnTwoHosts(const std::string& job, const std::string& dir, int port) {
  TwoHostRun run;
  EXPECT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  const std::string secret = dir + "/secret";
  std::ofstream(secret) << "multihost-test-secret-0123456789";
  EXPECT_EQ(chmod(secret.c_str(), 0600), 0);
  const std::string train = std::string(CHORUS_BINARY) + " train --set devices=cpu,cpu" + job +
                            " --nnodes 2 --rdzv-endpoint 10.77.0.1:" + std::to_string(port) +
                            " --secret-file " + secret;
  const std::uint64_t tx_before = MultihostMultiproc::linkTxBytes();
  int codes[2] = {-1, -1};
  std::thread second([&] {
    codes[1] = MultihostMultiproc::inHost(1, train + " --node-rank 1", dir + "/node1.out");
  });
  codes[0] = MultihostMultiproc::inHost(
      0, train + " --node-rank 0 --log-json " + dir + "/hosts.jsonl", dir + "/node0.out");
  second.join();
  run.crossed = MultihostMultiproc::linkTxBytes() - tx_before;
  run.out0 = readFile(dir + "/node0.out");
  EXPECT_EQ(codes[0], 0) << run.out0;
  EXPECT_EQ(codes[1], 0) << readFile(dir + "/node1.out");
  run.losses = losses(dir + "/hosts.jsonl");
  return run;
}

// The losses of the same job on one host with four workers.
std::vector<double> onOneHost(const std::string& job, const std::string& dir) {
  const std::string single = std::string(CHORUS_BINARY) + " train --set devices=cpu,cpu,cpu,cpu" +
                             job + " --log-json " + dir + "/single.jsonl";
  EXPECT_EQ(exitCode(std::system((single + " >" + dir + "/single.out 2>&1").c_str())), 0)
      << readFile(dir + "/single.out");
  return losses(dir + "/single.jsonl");
}

void expectSameLosses(const std::vector<double>& hosts, const std::vector<double>& one) {
  ASSERT_EQ(hosts.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(one.size(), static_cast<size_t>(kSteps));
  for (int step = 0; step < kSteps; ++step)
    EXPECT_NEAR(hosts[step], one[step], 1e-5 * std::abs(one[step])) << "step " << step + 1;
}

TEST_F(MultihostMultiproc, TwoHostsOfTwoWorkersTrainAsFourWorkersOnOneHost) {
  const std::string dir = testing::TempDir() + "/" + prefix_;
  const TwoHostRun run = runOnTwoHosts(kJob + " --set comm.algorithm=hierarchical", dir, 29411);
  ASSERT_FALSE(HasFailure());
  EXPECT_NE(run.out0.find("hierarchical over 4 ranks in 2 groups"), std::string::npos) << run.out0;
  // Each step the host leaders all-reduce the whole gradient: a two-rank ring sends all of it.
  EXPECT_GE(run.crossed, kSteps * kGradientBytes);
  const std::vector<double> one = onOneHost(kJob, dir);
  expectSameLosses(run.losses, one);
  EXPECT_LT(one.back(), one.front()) << "the job did not train";
}

// Two pipeline replicas of two stages, replica r on host r: each node lists only its own two
// devices, node 0 counts the layout on all four once they joined, and each stage's gradient
// all-reduce crosses the link. Same losses as the pipeline on one host.
TEST_F(MultihostMultiproc, APipelineWithAReplicaPerHostTrainsAsOnOneHost) {
  const std::string dir = testing::TempDir() + "/" + prefix_ + "-pipeline";
  const std::string pipeline = kJob +
                               " --set parallel.pipeline_stages=2 --set parallel.replicas=2"
                               " --set parallel.micro_batches=2 --set parallel.partition=even";
  const TwoHostRun run = runOnTwoHosts(pipeline, dir, 29412);
  ASSERT_FALSE(HasFailure());
  EXPECT_NE(run.out0.find("2 stages x 2 replica(s)"), std::string::npos) << run.out0;
  // Each stage's two-rank all-reduce sends its whole gradient across: the model's, per step.
  EXPECT_GE(run.crossed, kSteps * kGradientBytes);
  expectSameLosses(run.losses, onOneHost(pipeline, dir));
}

}  // namespace
