// The adaptive pipeline cut (issue 19 part 2): one stage's device slows to half its speed
// mid-run; steps per second after the change with
//   (a) fixed:    the start cut kept (parallel.recut = "off"),
//   (b) adaptive: parallel.recut = "adaptive", which must notice and move layers,
//   (c) oracle:   a cut for the new speeds from the start: the better (in the same run) of
//                 the automatic cut for the new speeds and the cut (b) ended on, each fixed,
// and adaptive / oracle (the issue's target: >= 0.80), over seeded configurations: start speeds in
// [0.6, 1] × --speed-scale, the slowed stage alternating. Ranks are threads of one process over
// an in-memory store through runtime::Trainer (the `chorus train` path: the policy, the move of
// layers with their optimizer state, the rebuild), one intra-op thread each, padded to their
// emulated speeds (TrainerHooks::speed_at). Throughput after the change counts every step from
// the change to the end, so the steps the adaptive cut needs to notice and the move itself are
// paid for.
//
//   pipeline_recut_bench [--configs N] [--steps N] [--change-at N] [--speed-scale F] [--json PATH]
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "chorus/comm/store/memory_store.h"
#include "chorus/core/clock.h"
#include "chorus/core/config.h"
#include "chorus/parallel/pipeline_recut.h"
#include "chorus/runtime/job/job_config.h"
#include "chorus/runtime/launch/worker.h"
#include "chorus/runtime/train/trainer.h"

namespace {

using namespace chorus;
using nlohmann::json;

constexpr const char* kJob = R"(
seed = 7
balance = "off"
[train]
global_batch = 32
eval_every = 0
[model]
kind = "gpt"
vocab = 32
layers = 6
width = 64
heads = 4
context = 32
[data]
dataset = "synthetic"
size = 4096
[optimizer]
lr = 0.01
[parallel]
pipeline_stages = 2
micro_batches = 4
)";

struct Args {
  int configs = 4;
  int steps = 100;
  int change_at = 50;
  double speed_scale = 0.5;
  std::string json_path = "bench/results/pipeline_recut.json";
};

struct Scenario {
  std::vector<double> before;  // emulated speed per stage until the change
  std::vector<double> after;   // from the change on
};

struct Outcome {
  double steps_per_second = 0;  // over the steps from the change to the end
  std::vector<int> start_cut, end_cut;
  std::vector<std::string> recuts;
};

std::string speedSpec(double speed) {
  char text[32];
  std::snprintf(text, sizeof text, "cpu@%.4g", speed);
  return text;
}

// Trains `args.steps` steps on two rank threads declared with `declared` speeds (which the start
// cut is made for) and running at config.before, then config.after.
Outcome train(const Args& args, const Scenario& config, const std::vector<double>& declared,
              const std::vector<std::string>& settings) {
  auto store = std::make_shared<comm::MemoryStore>();
  Outcome outcome;
  std::vector<std::string> errors(2);
  double change_time = 0, end_time = 0;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank)
    threads.emplace_back([&, rank] {
      try {
        at::set_num_threads(1);
        chorus::Config toml = chorus::Config::parseString(kJob);
        toml.set("devices=" + speedSpec(declared[0]) + "," + speedSpec(declared[1]));
        toml.set("train.steps=" + std::to_string(args.steps));
        for (const auto& setting : settings) toml.set(setting);
        const runtime::JobConfig job = runtime::readJobConfig(toml);
        runtime::InitOptions options;
        options.environment =
            runtime::Environment{{"CHORUS_RANK", std::to_string(rank)},
                                 {"CHORUS_WORLD_SIZE", "2"},
                                 {"CHORUS_DEVICE", speedSpec(declared[rank])},
                                 {"CHORUS_RDZV_ENDPOINT", "127.0.0.1:1"},
                                 {"CHORUS_SECRET_FILE", "unused: the store is in memory"},
                                 {"CHORUS_LOG_LEVEL", "warn"}};
        options.store = store;
        runtime::Trainer trainer(job, runtime::init(options));
        runtime::TrainerHooks hooks;
        hooks.speed_at = [&, rank](std::int64_t step) {
          return step < args.change_at ? config.before[rank] : config.after[rank];
        };
        if (rank == 0) outcome.start_cut = trainer.cuts();
        Stopwatch clock;
        while (trainer.nextStep() < args.steps) {
          if (trainer.nextStep() == args.change_at && rank == 0) change_time = clock.seconds();
          const runtime::StepRecord record = trainer.step(hooks);
          if (rank == 0 && !record.recut.empty())
            outcome.recuts.push_back("step " + std::to_string(record.step) + ": " + record.recut);
        }
        if (rank == 0) {
          end_time = clock.seconds();
          outcome.end_cut = trainer.cuts();
        }
      } catch (const std::exception& error) {
        errors[rank] = error.what();
      }
    });
  for (auto& thread : threads) thread.join();
  for (const auto& error : errors)
    if (!error.empty()) throw std::runtime_error(error);
  outcome.steps_per_second = (args.steps - args.change_at) / (end_time - change_time);
  return outcome;
}

Scenario configOf(int seed, double scale) {
  std::uint64_t state = 0x9E3779B97F4A7C15ULL * static_cast<std::uint64_t>(seed + 1);
  const auto uniform = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(state >> 11) / static_cast<double>(1ULL << 53);
  };
  Scenario config;
  for (int s = 0; s < 2; ++s) config.before.push_back(scale * (0.6 + 0.4 * uniform()));
  config.after = config.before;
  config.after[seed % 2] *= 0.5;  // the slowed stage alternates
  return config;
}

json outcomeJson(const Outcome& outcome) {
  return {{"steps_per_s", outcome.steps_per_second},
          {"start_cut", outcome.start_cut},
          {"end_cut", outcome.end_cut},
          {"recuts", outcome.recuts}};
}

Args parseArgs(int argc, char** argv) {
  Args args;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--configs")
      args.configs = std::stoi(value);
    else if (flag == "--steps")
      args.steps = std::stoi(value);
    else if (flag == "--change-at")
      args.change_at = std::stoi(value);
    else if (flag == "--speed-scale")
      args.speed_scale = std::stod(value);
    else if (flag == "--json")
      args.json_path = value;
    else
      throw std::runtime_error("unknown flag " + flag);
  }
  if (args.change_at < 1 || args.change_at >= args.steps)
    throw std::runtime_error("--change-at must be in [1, --steps)");
  return args;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args = parseArgs(argc, argv);
    json results = json::array();
    std::vector<double> ratios, fixed_ratios;
    std::printf("%-6s %-13s %-13s %-6s %-6s %-6s %-6s %-8s %-7s %s\n", "config", "speeds before",
                "speeds after", "fixed", "adapt", "auto", "ended", "adapt/or", "fix/or",
                "cuts fixed/adaptive/auto");
    for (int seed = 0; seed < args.configs; ++seed) {
      const Scenario config = configOf(seed, args.speed_scale);
      const Outcome fixed = train(args, config, config.before, {});
      const Outcome adaptive = train(args, config, config.before, {"parallel.recut=adaptive"});
      // The automatic cut for the new speeds, and the cut the adaptive run ended on, from the
      // start.
      const Outcome automatic = train(args, config, config.after, {});
      std::string counts;
      for (std::size_t s = 0; s + 1 < adaptive.end_cut.size(); ++s)
        counts += (s ? "," : "") + std::to_string(adaptive.end_cut[s + 1] - adaptive.end_cut[s]);
      const Outcome ended = train(args, config, config.after, {"parallel.partition=" + counts});
      const double oracle = std::max(automatic.steps_per_second, ended.steps_per_second);
      const double ratio = adaptive.steps_per_second / oracle;
      const double fixed_ratio = fixed.steps_per_second / oracle;
      ratios.push_back(ratio);
      fixed_ratios.push_back(fixed_ratio);
      char speeds[2][32];
      std::snprintf(speeds[0], sizeof speeds[0], "%.3f/%.3f", config.before[0], config.before[1]);
      std::snprintf(speeds[1], sizeof speeds[1], "%.3f/%.3f", config.after[0], config.after[1]);
      std::printf("%-6d %-13s %-13s %-6.2f %-6.2f %-6.2f %-6.2f %-8.2f %-7.2f %s/%s/%s\n", seed,
                  speeds[0], speeds[1], fixed.steps_per_second, adaptive.steps_per_second,
                  automatic.steps_per_second, ended.steps_per_second, ratio, fixed_ratio,
                  parallel::describeCut(fixed.end_cut).c_str(),
                  parallel::describeCut(adaptive.end_cut).c_str(),
                  parallel::describeCut(automatic.end_cut).c_str());
      for (const auto& line : adaptive.recuts) std::printf("         %s\n", line.c_str());
      std::fflush(stdout);
      results.push_back({{"seed", seed},
                         {"speeds_before", config.before},
                         {"speeds_after", config.after},
                         {"fixed", outcomeJson(fixed)},
                         {"adaptive", outcomeJson(adaptive)},
                         {"auto_for_new_speeds", outcomeJson(automatic)},
                         {"adaptive_end_cut_fixed", outcomeJson(ended)},
                         {"oracle_steps_per_s", oracle},
                         {"adaptive_over_oracle", ratio},
                         {"fixed_over_oracle", fixed_ratio}});
    }
    const double low = *std::min_element(ratios.begin(), ratios.end());
    std::printf(
        "adaptive / oracle: min %.2f, median %.2f (target >= 0.80); fixed / oracle: min "
        "%.2f, median %.2f\n",
        low, median(ratios), *std::min_element(fixed_ratios.begin(), fixed_ratios.end()),
        median(fixed_ratios));
    char date[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
    json out = {{"bench", "pipeline_recut"},
                {"date", date},
                {"hardware_threads", std::thread::hardware_concurrency()},
                {"steps", args.steps},
                {"change_at", args.change_at},
                {"speed_scale", args.speed_scale},
                {"configs", results},
                {"adaptive_over_oracle_min", low},
                {"adaptive_over_oracle_median", median(ratios)},
                {"fixed_over_oracle_median", median(fixed_ratios)}};
    std::ofstream(args.json_path) << out.dump(1) << "\n";
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "pipeline_recut_bench: %s\n", error.what());
    return 1;
  }
}
