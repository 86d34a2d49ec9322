// Pipeline benchmark (issue 6). Ranks run as threads over one in-memory store, one intra-op thread
// each, every compute phase padded by a SpeedEmulator (thread CPU time basis) to its device speed.
//
//   (a) bubble:  equal stages; each stage's measured idle fraction for GPipe and 1F1B next to
//                the textbook (p - 1) / (M + p - 1), p in {2, 4}, M in {1, 2, 4, 8}.
//   (b) hetero:  speeds {1.0, 0.4}, 2 stages, 1F1B: throughput of the automatic cut against the
//                even cut (target >= 1.3x), measured in the same run.
//
//   pipeline_bench [--only bubble|hetero] [--steps N] [--speed-scale F] [--json PATH]
// --speed-scale multiplies every emulated speed (default 1): only the ratios matter, and on a
// host shared with other work a scale below 1 keeps the padding above the slow-down that
// descheduling adds to the wall time of the fastest device (which a speed of 1.0 never pads).
// The JSON (default bench/results/pipeline.json) gets both tables; bench/pipeline_torch.py adds
// PyTorch's pipelining on the same model and speeds.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "chorus/comm/store/memory_store.h"
#include "chorus/core/clock.h"
#include "chorus/data/synthetic.h"
#include "chorus/model/model_config.h"
#include "chorus/parallel/pipeline.h"

namespace {

using namespace chorus;
using nlohmann::json;

model::ModelConfig benchModel() {
  model::ModelConfig config;
  config.kind = "gpt";
  config.vocab = 64;
  config.layers = 8;
  config.width = 128;
  config.heads = 4;
  config.context = 64;
  return config;
}

struct RunSpec {
  parallel::PipelineOptions options;
  std::vector<double> speeds;  // per stage
  int warmup = 1;
  int steps = 3;
};

struct RunResult {
  std::vector<int> cuts;
  double samples_per_second = 0;
  std::vector<double> idle;     // per stage, mean over timed steps
  std::vector<double> compute;  // per stage, seconds per step (padding included)
  double step_seconds = 0;      // mean over timed steps, slowest rank
};

// Trains the bench model with `spec` on one thread per stage and measures the timed steps.
RunResult runPipeline(const RunSpec& spec) {
  const int stages = spec.options.pipeline_stages;
  const model::ModelConfig config = benchModel();
  const data::SyntheticTokens dataset(1 << 16, config.context, config.vocab, 3);
  auto store = std::make_shared<comm::MemoryStore>();
  RunResult result;
  result.idle.assign(stages, 0.0);
  result.compute.assign(stages, 0.0);
  std::vector<double> elapsed(stages, 0.0), step_total(stages, 0.0);
  std::vector<std::exception_ptr> errors(stages);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < stages; ++rank)
    threads.emplace_back([&, rank] {
      try {
        auto world = comm::Communicator::create(store, rank, stages);
        auto model = model::makeModel(config, 11);
        parallel::CutRequest cut;
        cut.profile = model->profile();
        cut.options = spec.options;
        cut.devices.assign(1, {});
        for (double speed : spec.speeds) cut.devices[0].push_back({speed, 0});
        const std::vector<int> cuts = parallel::stageCuts(cut);
        if (rank == 0) result.cuts = cuts;
        device::SpeedEmulator emulator(spec.speeds[rank], device::TimeBasis::kThreadCpu);
        parallel::PipelineResources resources;
        resources.world = world;
        resources.emulator = &emulator;
        parallel::PipelineEngine engine(model, spec.options, cuts, resources);
        const std::int64_t batch = spec.options.global_batch;
        Stopwatch clock;
        for (int step = 0; step < spec.warmup + spec.steps; ++step) {
          if (step == spec.warmup) {
            world->barrier().wait();
            clock.reset();
          }
          std::vector<std::int64_t> ids;
          for (std::int64_t i = 0; i < batch; ++i) ids.push_back(step * batch + i);
          const data::Batch data = dataset.get(ids);
          const parallel::PipelineStepStats stats = engine.step(data.inputs, data.targets);
          if (step >= spec.warmup) {
            result.idle[rank] += stats.idle_fraction / spec.steps;
            result.compute[rank] += stats.compute_seconds / spec.steps;
            step_total[rank] += stats.step_seconds;
          }
          // Plain SGD without momentum: the step's cost is not what is measured here.
          torch::NoGradGuard no_grad;
          for (const at::Tensor& parameter : engine.parameters())
            parameter.sub_(parameter.grad(), 0.01);
        }
        elapsed[rank] = clock.seconds();
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  for (auto& thread : threads) thread.join();
  for (auto& error : errors)
    if (error) std::rethrow_exception(error);
  const double slowest = *std::max_element(elapsed.begin(), elapsed.end());
  result.samples_per_second = static_cast<double>(spec.options.global_batch) * spec.steps / slowest;
  result.step_seconds = *std::max_element(step_total.begin(), step_total.end()) / spec.steps;
  return result;
}

// The automatic cut of the bench model into `stages` equal-speed stages for 8 micro-batches, as
// explicit layer counts: every M runs the same, balanced stages (for M = 1 the objective does not
// care about balance, and any cut is as good as another).
std::string balancedPartition(int stages) {
  parallel::CutRequest cut;
  cut.profile = model::makeModel(benchModel(), 11)->profile();
  cut.options.pipeline_stages = stages;
  cut.options.micro_batches = 8;
  cut.options.global_batch = 32;
  const std::vector<int> cuts = parallel::stageCuts(cut);
  std::ostringstream counts;
  for (int s = 0; s < stages; ++s) counts << (s == 0 ? "" : ",") << cuts[s + 1] - cuts[s];
  return counts.str();
}

json bubbleTable(int steps, double scale) {
  json rows = json::array();
  std::printf("\n(a) bubble: equal stages, micro-batch of 4, emulated speed %.2f/p per stage\n",
              scale);
  std::printf("%-6s %2s %2s %8s  %s\n", "sched", "p", "M", "theory", "measured idle per stage");
  for (int stages : {2, 4}) {
    const std::string partition = balancedPartition(stages);
    for (parallel::Schedule schedule : {parallel::Schedule::kGpipe, parallel::Schedule::kOneFOneB})
      for (int micro : {1, 2, 4, 8}) {
        RunSpec spec;
        spec.options.pipeline_stages = stages;
        spec.options.schedule = schedule;
        spec.options.micro_batches = micro;
        spec.options.global_batch = 4 * micro;
        spec.options.partition = partition;
        spec.speeds.assign(stages, scale / stages);
        spec.steps = steps;
        const RunResult run = runPipeline(spec);
        const double theory = parallel::theoreticalBubble(stages, micro);
        std::printf("%-6s %2d %2d %8.3f ", plan::toString(schedule), stages, micro, theory);
        for (double idle : run.idle) std::printf(" %.3f", idle);
        std::printf("   (cuts");
        for (int cut : run.cuts) std::printf(" %d", cut);
        std::printf(")\n");
        rows.push_back({{"schedule", plan::toString(schedule)},
                        {"stages", stages},
                        {"micro_batches", micro},
                        {"theory", theory},
                        {"idle_per_stage", run.idle},
                        {"cuts", run.cuts},
                        {"step_seconds", run.step_seconds}});
      }
  }
  return rows;
}

json heteroTable(int steps, double scale) {
  std::printf("\n(b) speeds {1.0, 0.4} x %.2f, 2 stages, 1F1B, M = 8, B = 32\n", scale);
  json rows = json::object();
  double even = 0, automatic = 0;
  for (const char* partition : {"even", "auto"}) {
    RunSpec spec;
    spec.options.pipeline_stages = 2;
    spec.options.schedule = parallel::Schedule::kOneFOneB;
    spec.options.micro_batches = 8;
    spec.options.global_batch = 32;
    spec.options.partition = partition;
    spec.speeds = {1.0 * scale, 0.4 * scale};
    spec.warmup = 2;
    spec.steps = steps;
    const RunResult run = runPipeline(spec);
    std::printf(
        "%-5s cuts %d|%d|%d  %7.1f samples/s  step %.3f s  compute %.3f / %.3f s  idle %.2f / "
        "%.2f\n",
        partition, run.cuts[0], run.cuts[1], run.cuts[2], run.samples_per_second, run.step_seconds,
        run.compute[0], run.compute[1], run.idle[0], run.idle[1]);
    rows[partition] = {{"cuts", run.cuts},
                       {"samples_per_second", run.samples_per_second},
                       {"step_seconds", run.step_seconds},
                       {"compute_seconds_per_stage", run.compute},
                       {"idle_per_stage", run.idle}};
    (std::strcmp(partition, "auto") == 0 ? automatic : even) = run.samples_per_second;
  }
  rows["auto_over_even"] = automatic / even;
  std::printf("auto / even throughput: %.2fx (target >= 1.3x)\n", automatic / even);
  return rows;
}

std::string today() {
  const std::time_t now = std::time(nullptr);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%d", std::gmtime(&now));
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  // Relative to the working directory: run it from the repository root.
  std::string only, path = "bench/results/pipeline.json";
  int steps = 4;
  double scale = 1.0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--only" && i + 1 < argc)
      only = argv[++i];
    else if (arg == "--steps" && i + 1 < argc)
      steps = std::stoi(argv[++i]);
    else if (arg == "--speed-scale" && i + 1 < argc)
      scale = std::stod(argv[++i]);
    else if (arg == "--json" && i + 1 < argc)
      path = argv[++i];
    else {
      std::cerr << "usage: pipeline_bench [--only bubble|hetero] [--steps N] [--speed-scale F] "
                   "[--json PATH]\n";
      return 2;
    }
  }
  at::set_num_threads(1);
  json out;
  {
    std::ifstream existing(path);
    if (existing) out = json::parse(existing, nullptr, /*allow_exceptions=*/false);
    if (out.is_discarded() || !out.is_object()) out = json::object();
  }
  const model::ModelConfig config = benchModel();
  out["machine"] = {{"cpus", std::thread::hardware_concurrency()}, {"date", today()}};
  out["model"] = {{"kind", "gpt"},         {"layers", config.layers},   {"width", config.width},
                  {"heads", config.heads}, {"context", config.context}, {"vocab", config.vocab}};
  try {
    if (scale <= 0 || scale > 1) throw std::invalid_argument("--speed-scale must be in (0, 1]");
    out["speed_scale"] = scale;
    if (only.empty() || only == "bubble") out["bubble"] = bubbleTable(steps, scale);
    if (only.empty() || only == "hetero") out["hetero"] = heteroTable(std::max(steps, 6), scale);
  } catch (const std::exception& error) {
    std::cerr << "pipeline_bench: " << error.what() << "\n";
    return 1;
  }
  std::ofstream(path) << out.dump(2) << "\n";
  std::printf("\nwrote %s\n", path.c_str());
  return 0;
}
