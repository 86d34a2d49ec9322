// The job's store in etcd (`--rdzv-backend etcd`, docs/elastic.md "No single point of failure"):
// an elastic job of two hosts outlives node 0 killed with its agent, and the agents refuse what
// they cannot do. The two-host test runs three network-namespace hosts (scripts/netns_hosts):
// etcd in host 2, which no node runs on, and node r of the job in host r. It needs root, `ip
// netns` and etcd (skipped without the first two; without etcd it fails where scripts/setup
// could have installed it, as the etcd store's tests do).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "chorus/comm/store/etcd_store.h"
#include "chorus/comm/store/job_secret.h"
#include "chorus/runtime/checkpoint/checkpoint.h"
#include "chorus_version.h"
#include "comm/store/etcd_process.h"
#include "runtime/checkpoint_model.h"
#include "runtime/chorus_cli.h"

namespace chorus::testing {
namespace {

using std::chrono::seconds;

std::string netnsScript() { return std::string(CHORUS_SOURCE_DIR) + "/scripts/netns_hosts"; }

std::string readFile(const std::string& path) {
  std::ifstream file(path);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

std::string writeSecret(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/secret";
  std::ofstream(path) << comm::JobSecret::generate().text();
  chmod(path.c_str(), 0600);
  return path;
}

// Starts `argv` with its output into `output`; returns its pid. `netns_hosts exec` execs all the
// way down, so the pid is the command's own (the agent's, for `chorus train`).
pid_t spawn(const std::vector<std::string>& argv, const std::string& output) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(output.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    std::vector<char*> args;
    for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

// The exit code of `pid` once it ended, -signal when a signal ended it, or nullopt when it did not
// end within `timeout` (then it is killed and reaped).
std::optional<int> awaitExit(pid_t pid, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > until) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return std::nullopt;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

// `root` and every process below it, by pid (from /proc): never a pattern, which could match
// another job's processes on the machine.
std::vector<pid_t> processTree(pid_t root) {
  std::map<pid_t, std::vector<pid_t>> children;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    std::istringstream rest(line.substr(line.rfind(')') + 2));
    char state = 0;
    pid_t parent = 0;
    rest >> state >> parent;
    children[parent].push_back(static_cast<pid_t>(std::stol(name)));
  }
  std::vector<pid_t> tree{root};
  for (std::size_t i = 0; i < tree.size(); ++i)
    for (pid_t child : children[tree[i]]) tree.push_back(child);
  return tree;
}

struct JobLog {
  std::vector<nlohmann::json> steps;
  std::vector<nlohmann::json> recoveries;
};

JobLog readLog(const std::string& path) {
  JobLog log;
  std::ifstream lines(path);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    const nlohmann::json json = nlohmann::json::parse(line, nullptr, false);
    if (json.is_discarded()) continue;  // a line being written
    (json.contains("event") ? log.recoveries : log.steps).push_back(json);
  }
  return log;
}

constexpr int kSteps = 16;

// An MLP on synthetic data with fixed shares (balance off) and checkpoints in `dir`: its
// trajectory does not depend on how many workers share a step. CPUs emulated at 1/50 speed, so
// that a step takes about 100 ms and node 0 dies mid-run.
std::string job(const std::string& devices, const std::string& dir) {
  return "--set devices=" + devices +
         " --set balance=off --set model.kind=mlp --set model.hidden=[64,32]"
         " --set data.dataset=synthetic --set data.size=4096 --set train.global_batch=120"
         " --set train.steps=" +
         std::to_string(kSteps) +
         " --set train.eval_every=0 --set train.eval_samples=256 --set train.target_accuracy=0"
         " --set optimizer.name=adamw --set optimizer.lr=0.003 --set comm.bucket_mb=0.004" +
         elasticArgs() + " --set checkpoint.dir=" + dir;
}

std::vector<std::string> words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string word; in >> word;) out.push_back(word);
  return out;
}

void expectSameModel(const std::string& dir, const std::string& reference_dir) {
  const auto got = runtime::listCheckpoints(dir);
  const auto want = runtime::listCheckpoints(reference_dir);
  ASSERT_FALSE(got.empty()) << "no checkpoint in " << dir;
  ASSERT_FALSE(want.empty()) << "no checkpoint in " << reference_dir;
  const auto model = checkpointModel(dir + "/" + got.front());
  const auto reference = checkpointModel(reference_dir + "/" + want.front());
  ASSERT_EQ(model.size(), reference.size());
  for (const auto& [name, expected] : reference) {
    const double scale = expected.abs().max().item<double>();
    const double difference = (model.at(name) - expected).abs().max().item<double>();
    EXPECT_LE(difference, 1e-6 * std::max(scale, 1e-12)) << name;
  }
}

// Three hosts for the suite: 0 and 1 run the job's nodes, 2 runs etcd.
class ElasticEtcdMultiproc : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (geteuid() != 0) {
      skip_ = "needs root to create network namespaces";
      return;
    }
    if (std::system("ip netns list >/dev/null 2>&1") != 0) {
      skip_ = "`ip netns` is unavailable";
      return;
    }
    failure_ = comm::testing::etcdMissing();
    if (!failure_.empty()) return;
    prefix_ = "cee" + std::to_string(getpid() % 100000);
    dir_ = ::testing::TempDir() + "/" + prefix_;
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    const std::string log = dir_ + "/create.log";
    if (std::system(
            (netnsScript() + " create 3 --shaped none --prefix " + prefix_ + " >" + log + " 2>&1")
                .c_str()) != 0) {
      failure_ = "scripts/netns_hosts create failed:\n" + readFile(log);
      return;
    }
    // etcd in host 2 (10.77.0.3), its data in the suite's directory.
    const std::string client = "http://10.77.0.3:2379", peer = "http://10.77.0.3:2380";
    etcd_ = spawn(inHost(2, {"/usr/bin/env",
                             "etcd",
                             "--name",
                             "e",
                             "--data-dir",
                             dir_ + "/etcd",
                             "--listen-client-urls",
                             client,
                             "--advertise-client-urls",
                             client,
                             "--listen-peer-urls",
                             peer,
                             "--initial-advertise-peer-urls",
                             peer,
                             "--initial-cluster",
                             "e=" + peer,
                             "--logger",
                             "zap",
                             "--log-outputs",
                             "stderr"}),
                  dir_ + "/etcd.log");
  }
  static void TearDownTestSuite() {
    if (etcd_ > 0) {
      ::kill(etcd_, SIGTERM);
      awaitExit(etcd_, seconds(10));
    }
    if (!prefix_.empty()) std::system((netnsScript() + " destroy --prefix " + prefix_).c_str());
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_TRUE(failure_.empty()) << failure_;
  }

  static std::vector<std::string> inHost(int host, const std::vector<std::string>& command) {
    std::vector<std::string> line = {netnsScript(), "exec",  std::to_string(host),
                                     "--prefix",    prefix_, "--"};
    line.insert(line.end(), command.begin(), command.end());
    return line;
  }

  static std::string skip_, failure_, prefix_, dir_;
  static pid_t etcd_;
};

std::string ElasticEtcdMultiproc::skip_;
std::string ElasticEtcdMultiproc::failure_;
std::string ElasticEtcdMultiproc::prefix_;
std::string ElasticEtcdMultiproc::dir_;
pid_t ElasticEtcdMultiproc::etcd_ = -1;

// Node 0 (ranks 0 and 1 in host 0) and node 1 (ranks 2 and 3 in host 1) train with the store in
// etcd; once 5 steps are logged, node 0's agent and its workers are SIGKILLed by pid. Node 1's
// workers recover (they lost 0 and 1), finish every step exactly once, and end with the model of
// the uninterrupted job on four workers within 1e-6; node 1's agent exits 0 once it gave node 0
// up, and deletes the job's keys from etcd.
TEST_F(ElasticEtcdMultiproc, NodeZeroKilledWithItsAgentTheOtherNodeFinishesTheJob) {
  const std::string dir = dir_ + "/loss";
  const std::string secret = writeSecret(dir);
  const std::string log = dir + "/steps.jsonl";
  std::vector<std::string> train = {CHORUS_BINARY, "train"};
  for (const std::string& word : words(job("cpu@0.02,cpu@0.02", dir + "/checkpoints") +
                                       " --nnodes 2 --rdzv-backend etcd --rdzv-endpoint "
                                       "10.77.0.3:2379 --secret-file " +
                                       secret + " --log-json " + log))
    train.push_back(word);
  auto node = [&](int rank) {
    std::vector<std::string> command = train;
    command.insert(command.end(), {"--node-rank", std::to_string(rank)});
    return spawn(inHost(rank, command), dir + "/node" + std::to_string(rank) + ".out");
  };
  const pid_t node1 = node(1);
  const pid_t node0 = node(0);
  const auto until = std::chrono::steady_clock::now() + seconds(120);
  while (readLog(log).steps.size() < 5 && std::chrono::steady_clock::now() < until &&
         ::waitpid(node0, nullptr, WNOHANG) == 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const std::size_t logged = readLog(log).steps.size();
  for (pid_t pid : processTree(node0)) ::kill(pid, SIGKILL);
  EXPECT_EQ(awaitExit(node0, seconds(10)), -SIGKILL);
  ASSERT_GE(logged, 5u) << readFile(dir + "/node0.out");
  ASSERT_LT(logged, static_cast<std::size_t>(kSteps)) << "node 0 was not killed mid-run";

  const std::optional<int> code1 = awaitExit(node1, seconds(180));
  const std::string out1 = readFile(dir + "/node1.out");
  ASSERT_TRUE(code1.has_value()) << "node 1 did not end within 180 s:\n" << out1;
  EXPECT_EQ(*code1, 0) << out1;
  const JobLog run = readLog(log);
  ASSERT_EQ(run.steps.size(), static_cast<std::size_t>(kSteps)) << out1;
  for (int i = 0; i < kSteps; ++i) EXPECT_EQ(run.steps[i].at("step").get<int>(), i + 1);
  ASSERT_EQ(run.recoveries.size(), 1u) << out1;
  EXPECT_EQ(run.recoveries[0].at("lost").get<std::vector<int>>(), (std::vector<int>{0, 1}));
  EXPECT_EQ(run.recoveries[0].at("members").get<std::vector<int>>(), (std::vector<int>{2, 3}));
  EXPECT_NE(out1.find("node 0 is neither done nor heard from"), std::string::npos) << out1;
  EXPECT_NE(out1.find("deleted the job's"), std::string::npos) << out1;

  // The same job, uninterrupted, on four workers of one host (the store on node 0, as usual).
  const CommandResult reference =
      runCommand(std::string(CHORUS_BINARY) + " train " +
                 job("cpu@0.02,cpu@0.02,cpu@0.02,cpu@0.02", dir + "/reference-checkpoints"));
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  expectSameModel(dir + "/checkpoints", dir + "/reference-checkpoints");
}

// With the store in etcd, the agents refuse a job they cannot run as asked, before any worker.
TEST(ElasticEtcdConfig, EtcdWithoutAnEndpointIsAConfigError) {
  const CommandResult run = chorusRun("--devices cpu --rdzv-backend etcd", "true");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--rdzv-backend etcd needs --rdzv-endpoint"), std::string::npos)
      << run.output;
  const CommandResult other = chorusRun("--devices cpu --rdzv-backend zookeeper", "true");
  EXPECT_EQ(other.exit_code, 2) << other.output;
}

// A job whose secret's prefix holds an earlier job's keys (one whose node 0 died, say) is refused,
// naming the prefix and how to delete it; a job that ends deletes its own keys.
TEST(ElasticEtcdConfig, AnEarlierJobsKeysAreRefusedAndAFinishedJobLeavesNone) {
  CHORUS_REQUIRE_ETCD();
  comm::testing::EtcdProcess etcd;
  const std::string dir = ::testing::TempDir() + "/etcd-config-" + std::to_string(getpid());
  const std::string secret = writeSecret(dir);
  comm::EtcdStore store(etcd.options(comm::etcdJobPrefix(comm::JobSecret::fromFile(secret))));
  const std::string args = "--devices cpu,cpu --elastic --rdzv-backend etcd --rdzv-endpoint " +
                           etcd.endpoint() + " --secret-file " + secret;
  const CommandResult clean = chorusRun(args, std::string(CHORUS_TEST_WORKER) + " collectives");
  EXPECT_EQ(clean.exit_code, 0) << clean.output;
  EXPECT_EQ(store.numKeys(), 0) << clean.output;

  store.setString("job/package", "an earlier job's");
  const CommandResult stale = chorusRun(args, "true");
  EXPECT_EQ(stale.exit_code, 2) << stale.output;
  EXPECT_NE(stale.output.find("del --prefix " + store.options().prefix), std::string::npos)
      << stale.output;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace chorus::testing
