// Checkpoint benchmark (issue 4): checkpoint write speed next to the disk's raw sequential write
// speed, both measured in this run, and the step-time overhead of synchronous vs. asynchronous
// checkpoints.
//
//   build/bench/checkpoint_bench [--dir DIR] [--json bench/results/checkpoint.json]
//
// One rank, the zoo's GPT sized to ~100 MB of checkpoint (model + AdamW state), on the CPU.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "chorus/comm/store/memory_store.h"
#include "chorus/core/clock.h"
#include "chorus/core/config.h"
#include "chorus/runtime/job/job_config.h"
#include "chorus/runtime/launch/worker.h"
#include "chorus/runtime/train/trainer.h"

namespace {
namespace fs = std::filesystem;
using namespace chorus;

constexpr const char* kJob = R"(
seed = 1
balance = "off"
[train]
global_batch = 8
eval_every = 0
eval_samples = 8
[model]
kind = "gpt"
vocab = 64
layers = 4
width = 256
heads = 4
context = 32
[data]
dataset = "synthetic"
size = 512
[optimizer]
name = "adamw"
lr = 0.001
)";

// MB/s of writing `bytes` to a fresh file with write() in 4 MiB blocks, then fsync.
double rawWriteMBps(const std::string& dir, std::size_t bytes) {
  const std::string path = dir + "/raw.bin";
  const std::string block(4 << 20, 'x');
  Stopwatch clock;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (std::size_t done = 0; done < bytes; done += block.size())
    if (::write(fd, block.data(), block.size()) < 0) std::perror("write");
  ::fsync(fd);
  ::close(fd);
  const double seconds = clock.seconds();
  fs::remove(path);
  return static_cast<double>(bytes) / 1e6 / seconds;
}

std::unique_ptr<runtime::Trainer> makeTrainer(const std::string& checkpoint_dir, bool async,
                                              std::int64_t every, std::int64_t steps) {
  Config config = Config::parseString(kJob);
  config.set("train.steps=" + std::to_string(steps));
  if (!checkpoint_dir.empty()) {
    config.set("checkpoint.dir=" + checkpoint_dir);
    config.set("checkpoint.every=" + std::to_string(every));
    config.set(std::string("checkpoint.async=") + (async ? "true" : "false"));
    config.set("checkpoint.keep=2");
    config.set("checkpoint.at_end=false");  // only the periodic ones are measured
  }
  runtime::InitOptions options;
  options.environment =
      runtime::Environment{{"CHORUS_RANK", "0"},
                           {"CHORUS_WORLD_SIZE", "1"},
                           {"CHORUS_RDZV_ENDPOINT", "127.0.0.1:1"},
                           {"CHORUS_SECRET_FILE", "unused: the store is in memory"},
                           {"CHORUS_LOG_LEVEL", "warn"}};
  options.store = std::make_shared<comm::MemoryStore>();
  return std::make_unique<runtime::Trainer>(runtime::readJobConfig(config), runtime::init(options));
}

// Mean seconds per step over `steps` steps (after 2 warm-up steps run separately).
double meanStepSeconds(const std::string& dir, bool async, std::int64_t every, std::int64_t steps) {
  if (!dir.empty()) fs::remove_all(dir);
  auto trainer = makeTrainer(dir, async, every, steps + 2);
  trainer->step();
  trainer->step();
  Stopwatch clock;
  trainer->run();  // the remaining steps, checkpoints as configured (plus one at the end)
  return clock.seconds() / static_cast<double>(steps);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/tmp/chorus_checkpoint_bench";
  std::string json_path = "bench/results/checkpoint.json";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--dir") dir = argv[i + 1];
    if (flag == "--json") json_path = argv[i + 1];
  }
  fs::create_directories(dir);
  // 1. Write speed of one checkpoint vs the raw disk.
  auto trainer = makeTrainer(dir + "/speed", false, 0, 1);
  trainer->step();
  Stopwatch clock;
  const std::string path = trainer->checkpoint();
  const double checkpoint_seconds = clock.seconds();
  std::uintmax_t bytes = 0;
  for (const auto& entry : fs::directory_iterator(path)) bytes += entry.file_size();
  const double checkpoint_mbps = static_cast<double>(bytes) / 1e6 / checkpoint_seconds;
  const double raw_mbps = rawWriteMBps(dir, bytes);
  std::printf("checkpoint of %.1f MB: %.3f s, %.0f MB/s; raw sequential write %.0f MB/s (%.2f)\n",
              bytes / 1e6, checkpoint_seconds, checkpoint_mbps, raw_mbps,
              checkpoint_mbps / raw_mbps);
  // 2. Step-time overhead of checkpoints every 5 steps.
  const std::int64_t steps = 20, every = 5;
  const double base = meanStepSeconds("", false, every, steps);
  const double sync = meanStepSeconds(dir + "/sync", false, every, steps);
  const double async = meanStepSeconds(dir + "/async", true, every, steps);
  std::printf(
      "step time: none %.3f s | sync every %lld: %.3f s (+%.0f%%) | async: %.3f s (+%.0f%%)\n",
      base, static_cast<long long>(every), sync, 100 * (sync / base - 1), async,
      100 * (async / base - 1));
  nlohmann::json out = {{"checkpoint_bytes", bytes},
                        {"checkpoint_seconds", checkpoint_seconds},
                        {"checkpoint_MBps", checkpoint_mbps},
                        {"raw_write_MBps", raw_mbps},
                        {"ratio_to_raw", checkpoint_mbps / raw_mbps},
                        {"every", every},
                        {"step_s_none", base},
                        {"step_s_sync", sync},
                        {"step_s_async", async}};
  std::ofstream(json_path) << out.dump(2) << "\n";
  fs::remove_all(dir);
  return 0;
}
