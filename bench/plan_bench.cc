// Planner benchmark: how long `chorus plan` takes on the example clusters, what it predicts, and
// how its best plan compares with the best uniform plans (equal shares, equal cuts) and with the
// discrete-event simulator, all measured in this run.
//
//   plan_bench [--out plan_bench.json] [--quick]
//
// Targets (issue 7): 64 devices of 4 types < 1 s and 1,024 devices < 10 s for the GPT-3 175B
// shape. Each case is planned three times; the median time is reported.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chorus/plan/cluster_file.h"
#include "chorus/plan/planner.h"
#include "chorus/plan/simulator.h"
#include "chorus/plan/transformer_shapes.h"

namespace {

using namespace chorus::plan;

struct Case {
  const char* cluster;  // file under examples/clusters
  const char* model;
  int global_batch;
  double target_seconds;  // 0: no target
};

struct Outcome {
  double median_seconds = 0;
  PlanResult result;
  // The best plan over the best uniform plan that uses every device (0 when none fits).
  double gain_over_uniform_all_devices = 0;
  double simulated_seconds = 0;
  double simulate_wall_seconds = 0;
};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Outcome run(const Case& c, int repeats) {
  const Cluster cluster =
      loadClusterFile(std::string(CHORUS_EXAMPLES_DIR) + "/clusters/" + c.cluster);
  const ModelProfile model = resolveModel(c.model);
  PlanOptions options;
  options.global_batch = c.global_batch;
  Outcome outcome;
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    const double start = now();
    outcome.result = planCluster(cluster, model, options);
    times.push_back(now() - start);
  }
  std::sort(times.begin(), times.end());
  outcome.median_seconds = times[times.size() / 2];
  if (!outcome.result.plans.empty() && cluster.size() <= 64) {
    PlanOptions all = options;
    all.allow_dropping_devices = false;
    PlanResult on_all = planCluster(cluster, model, all);
    on_all.plans = {outcome.result.plans.front()};
    outcome.gain_over_uniform_all_devices = on_all.gainOverUniform();
  }
  if (!outcome.result.plans.empty()) {
    const CostModel cost(cluster, model, options.cost);
    const double start = now();
    outcome.simulated_seconds = simulate(cost, outcome.result.plans.front(), {false}).step_seconds;
    outcome.simulate_wall_seconds = now() - start;
  }
  return outcome;
}

std::string fixed(double value, const char* format) {
  char buffer[48];
  std::snprintf(buffer, sizeof buffer, format, value);
  return buffer;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path = "plan_bench.json";
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--out" && i + 1 < argc)
      out_path = argv[++i];
    else if (arg == "--quick")
      quick = true;
    else {
      std::cerr << "usage: plan_bench [--out FILE] [--quick]\n";
      return 2;
    }
  }
  const std::vector<Case> cases = {
      {"mixed-64.toml", "gpt3-175b", 512, 1.0},      {"mixed-1024.toml", "gpt3-175b", 1536, 10.0},
      {"a100-v100.toml", "gpt3-6.7b", 256, 0},       {"a100-v100.toml", "gpt3-1.3b", 256, 0},
      {"a100-t4.toml", "gpt3-1.3b", 128, 0},         {"a100-t4.toml", "gpt3-2.7b", 128, 0},
      {"small-mixed-node.toml", "gpt3-1.3b", 32, 0},
  };
  const int repeats = quick ? 1 : 3;
  std::cout << "case                                 plan time  target  step (pred)  step (sim)  "
               "gain vs uniform (all devices)  best plan\n";
  nlohmann::json rows = nlohmann::json::array();
  bool all_met = true;
  for (const Case& c : cases) {
    const Outcome o = run(c, repeats);
    const bool has_plan = !o.result.plans.empty();
    const double predicted = has_plan ? o.result.plans.front().predicted.step_seconds : 0;
    const bool met = c.target_seconds == 0 || o.median_seconds < c.target_seconds;
    all_met = all_met && met;
    const std::string name =
        std::string(c.cluster) + " " + c.model + " B=" + std::to_string(c.global_batch);
    std::printf(
        "%-36s %8.3f s  %-6s  %9.3f s  %9.3f s  %15s %-12s  %s\n", name.c_str(), o.median_seconds,
        c.target_seconds > 0 ? (fixed(c.target_seconds, "<%.0f s") + (met ? "" : "!")).c_str()
                             : "-",
        predicted, o.simulated_seconds,
        o.result.gainOverUniform() > 0 ? fixed(o.result.gainOverUniform(), "%.2fx").c_str() : "n/a",
        o.gain_over_uniform_all_devices > 0
            ? fixed(o.gain_over_uniform_all_devices, "(%.2fx)").c_str()
            : "",
        has_plan ? o.result.plans.front().summary().c_str() : "nothing fits");
    rows.push_back(
        {{"cluster", c.cluster},
         {"model", c.model},
         {"global_batch", c.global_batch},
         {"devices", o.result.devices},
         {"plan_seconds_median", o.median_seconds},
         {"repeats", repeats},
         {"target_seconds", c.target_seconds},
         {"target_met", met},
         {"candidates", o.result.candidates},
         {"predicted_step_seconds", predicted},
         {"simulated_step_seconds", o.simulated_seconds},
         {"simulate_wall_seconds", o.simulate_wall_seconds},
         {"gain_over_uniform", o.result.gainOverUniform()},
         {"gain_over_uniform_all_devices", o.gain_over_uniform_all_devices},
         {"uniform_data_parallel_step_seconds",
          o.result.uniform_data_parallel ? o.result.uniform_data_parallel->predicted.step_seconds
                                         : 0},
         {"uniform_pipeline_step_seconds",
          o.result.uniform_pipeline ? o.result.uniform_pipeline->predicted.step_seconds : 0},
         {"best_plan", has_plan ? o.result.plans.front().summary() : ""},
         {"reason", has_plan ? o.result.plans.front().reason : ""}});
  }
  std::ofstream out(out_path);
  out << nlohmann::json{{"benchmark", "plan_bench"}, {"cases", rows}}.dump(2) << "\n";
  std::cout << "results written to " << out_path << (all_met ? "" : "; a target was missed")
            << "\n";
  return all_met ? 0 : 1;
}
