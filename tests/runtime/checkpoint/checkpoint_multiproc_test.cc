// Checkpoints of `chorus train` with real worker processes: exact resume after SIGKILL of the
// whole job, and a checkpoint on SIGTERM.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/serialize.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "chorus/runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint_model.h"

namespace {
namespace fs = std::filesystem;

// A `chorus train` job running in the background, its output in a file.
struct Job {
  pid_t pid = -1;
  std::string output_path;
  std::string log_path;
};

Job startTrain(const std::vector<std::string>& args, const std::string& name) {
  Job job;
  job.output_path = ::testing::TempDir() + "/" + name + ".out";
  job.log_path = ::testing::TempDir() + "/" + name + ".jsonl";
  fs::remove(job.log_path);  // a stale log would count steps that this job never ran
  std::vector<std::string> argv{CHORUS_BINARY, "train", "--log-json", job.log_path};
  argv.insert(argv.end(), args.begin(), args.end());
  job.pid = ::fork();
  if (job.pid == 0) {
    const int fd = ::open(job.output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> c_argv;
    for (auto& arg : argv) c_argv.push_back(arg.data());
    c_argv.push_back(nullptr);
    ::execv(c_argv[0], c_argv.data());
    ::_exit(127);
  }
  return job;
}

std::string readText(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Waits for the job to exit; returns its exit code (128 + signal when killed).
int finish(const Job& job) {
  int status = 0;
  ::waitpid(job.pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Lines in the job's JSON log so far (= steps completed).
int stepsLogged(const Job& job) {
  std::ifstream in(job.log_path);
  int lines = 0;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty() && line.back() == '}') ++lines;
  return lines;
}

// Polls until `done()` or `limit` passes.
bool waitFor(const std::function<bool()>& done, std::chrono::seconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// The checkpoint's model; a ZeRO-3 checkpoint's consolidated from its slices first.
std::map<std::string, at::Tensor> modelOf(const std::string& checkpoint) {
  return chorus::testing::checkpointModel(checkpoint);
}

std::vector<std::string> jobArgs(const std::string& dir) {
  return {"--set", "devices=cpu@0.3,cpu@0.3", "--set", "balance=off",
          "--set", "model.kind=mlp",          "--set", "model.hidden=[64, 32]",
          "--set", "data.dataset=synthetic",  "--set", "data.size=4096",
          "--set", "train.steps=240",         "--set", "train.eval_every=0",
          "--set", "train.eval_samples=256",  "--set", "train.target_accuracy=0",
          "--set", "optimizer.name=adamw",    "--set", "optimizer.lr=0.003",
          "--set", "checkpoint.every=10",     "--set", "checkpoint.dir=" + dir};
}

// Invariant 4: killed at any moment, a job resumes as if nothing happened. Both workers and the
// agent die by SIGKILL at a random step after the first checkpoint; the resumed run's final
// parameters are bitwise those of an uninterrupted run.
void expectResumeAfterSigkillIsBitwiseExact(const std::vector<std::string>& extra,
                                            const std::string& name) {
  const auto argsOf = [&](const std::string& dir) {
    std::vector<std::string> args = jobArgs(dir);
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  const std::string straight_dir = ::testing::TempDir() + "/chorus_" + name + "_straight";
  const std::string killed_dir = ::testing::TempDir() + "/chorus_" + name + "_killed";
  fs::remove_all(straight_dir);
  fs::remove_all(killed_dir);
  const Job straight = startTrain(argsOf(straight_dir), name + "_straight");
  ASSERT_EQ(finish(straight), 0) << readText(straight.output_path);

  std::mt19937 random(std::random_device{}());
  const int kill_after = std::uniform_int_distribution<int>(15, 200)(random);
  const Job victim = startTrain(argsOf(killed_dir), name + "_killed");
  const bool reached =
      waitFor([&] { return stepsLogged(victim) >= kill_after; }, std::chrono::seconds(120));
  ::kill(victim.pid, SIGKILL);  // the agent; its workers follow (parent-death signal)
  finish(victim);
  ASSERT_TRUE(reached) << readText(victim.output_path);
  const int killed_at = stepsLogged(victim);
  std::printf("killed after step %d (asked for %d); latest: %s", killed_at, kill_after,
              readText(killed_dir + "/latest").c_str());
  ASSERT_LT(killed_at, 240) << "the job finished before the kill";

  std::vector<std::string> resume_args = argsOf(killed_dir);
  resume_args.insert(resume_args.end(), {"--resume", "latest"});
  const Job resumed = startTrain(resume_args, name + "_resumed");
  ASSERT_EQ(finish(resumed), 0) << readText(resumed.output_path);
  EXPECT_NE(readText(resumed.output_path).find("resuming from"), std::string::npos);

  const auto expected = modelOf(straight_dir + "/step-00000240");
  const auto actual = modelOf(killed_dir + "/step-00000240");
  ASSERT_EQ(actual.size(), expected.size());
  ASSERT_GE(expected.size(), 4u);
  for (const auto& [key, value] : expected) {
    ASSERT_TRUE(actual.count(key)) << key;
    EXPECT_TRUE(at::equal(actual.at(key), value)) << key << " differs after resume";
  }
}

TEST(CheckpointMultiproc, ResumeAfterSigkillIsBitwiseExact) {
  expectResumeAfterSigkillIsBitwiseExact({}, "exact");
}

// The same with ZeRO-2 and uneven shards: each worker's optimizer slice is in its rank file.
TEST(CheckpointMultiproc, ZeroResumeAfterSigkillIsBitwiseExact) {
  expectResumeAfterSigkillIsBitwiseExact(
      {"--set", "zero.stage=2", "--set", "zero.shards=[0.7,0.3]"}, "zero");
}

// ZeRO-3: each worker's rank file holds its slices of the parameters and of the optimizer state,
// and no file the whole model (consolidated here to compare).
TEST(CheckpointMultiproc, ZeroThreeResumeAfterSigkillIsBitwiseExact) {
  expectResumeAfterSigkillIsBitwiseExact(
      {"--set", "zero.stage=3", "--set", "zero.shards=[0.7,0.3]"}, "zero3");
}

// SIGTERM (what the agent sends on Ctrl-C): every rank finishes its step, one checkpoint is
// written, and the workers exit cleanly.
TEST(CheckpointMultiproc, SigtermWritesACheckpointBeforeStopping) {
  const std::string dir = ::testing::TempDir() + "/chorus_sigterm";
  fs::remove_all(dir);
  std::vector<std::string> args = jobArgs(dir);
  args.insert(args.end(), {"--set", "checkpoint.every=0", "--set", "train.steps=100000"});
  const Job job = startTrain(args, "sigterm");
  ASSERT_TRUE(waitFor([&] { return stepsLogged(job) >= 20; }, std::chrono::seconds(120)))
      << readText(job.output_path);
  ::kill(job.pid, SIGTERM);
  const int code = finish(job);
  const std::string output = readText(job.output_path);
  EXPECT_EQ(code, 128 + SIGTERM) << output;
  EXPECT_NE(output.find("stopped on request"), std::string::npos) << output;
  const std::string latest = readText(dir + "/latest");
  ASSERT_FALSE(latest.empty()) << output;
  const int step = std::stoi(latest.substr(5));
  EXPECT_GE(step, 20);
  EXPECT_EQ(step, stepsLogged(job)) << "the checkpoint is not of the last completed step";
}

}  // namespace
