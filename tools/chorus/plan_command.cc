// `chorus plan --cluster C.toml --model NAME --global-batch B [--top K] [--json] [--out
// PLAN.json]`: searches the parallel plans for a model on a described cluster and prints the best
// few with predicted step time, throughput, memory and why each wins or loses, next to the best
// uniform plans (equal shares, equal cuts) for the gain.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "chorus/core/units.h"
#include "chorus/plan/cluster_file.h"
#include "chorus/plan/plan_json.h"
#include "chorus/plan/planner.h"
#include "chorus/plan/transformer_shapes.h"
#include "commands.h"

namespace chorus::cli {
namespace {

struct PlanArgs {
  std::string cluster;
  std::string model;
  int global_batch = 0;
  int top = 5;
  bool json = false;
  std::string out;
  std::string precision = "mixed";
  bool allow_compression = false;
  bool no_pipelines = false;
  bool gpipe = false;
};

std::string seconds(double value) {
  char buffer[32];
  if (value >= 1)
    std::snprintf(buffer, sizeof buffer, "%.2f s", value);
  else
    std::snprintf(buffer, sizeof buffer, "%.1f ms", value * 1e3);
  return buffer;
}

std::string fixed(double value, const char* format) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, format, value);
  return buffer;
}

std::uint64_t peakMemory(const plan::Plan& plan) {
  std::uint64_t peak = 0;
  for (const auto& rank : plan.ranks) peak = std::max(peak, rank.predicted_memory);
  return peak;
}

void printPlanDetail(const plan::Plan& plan, const plan::Cluster& cluster) {
  std::cout << "\nplan #1, replica 0 of " << plan.replicas.size() << ":\n";
  const auto& replica = plan.replicas[0];
  for (size_t s = 0; s < replica.stages.size(); ++s) {
    const auto& stage = replica.stages[s];
    const auto& rank = plan.ranks[stage.rank];
    std::cout << "  stage " << s << ": layers [" << stage.first_layer << ", " << stage.last_layer
              << ") on " << rank.device_type << " (" << rank.node << "), "
              << plan::toString(rank.precision) << ", micro-batch " << stage.micro_batch
              << (stage.checkpoint ? ", checkpointed" : "") << ", "
              << formatBytes(rank.predicted_memory) << " of "
              << formatBytes(cluster.device(rank.device).type.memory_bytes) << "\n";
  }
  if (plan.stageCount() == 1) {
    std::cout << "  shares:";
    for (size_t r = 0; r < plan.replicas.size() && r < 16; ++r)
      std::cout << " " << plan.ranks[plan.replicas[r].stages[0].rank].device_type << ":"
                << plan.replicas[r].share;
    std::cout << (plan.replicas.size() > 16 ? " ..." : "") << "\n";
  }
}

void printTable(const plan::PlanResult& result, const plan::Cluster& cluster,
                const plan::ModelProfile& model, int global_batch) {
  std::cout << "# cluster " << cluster.name() << ": " << cluster.describe() << "\n"
            << "# model " << model.name << ": " << fixed(model.totalParams() / 1e9, "%.2f")
            << " B parameters in " << model.layerCount() << " layers; global batch " << global_batch
            << "\n"
            << "# searched " << result.candidates << " candidates in "
            << fixed(result.search_seconds, "%.2f") << " s\n";
  if (result.plans.empty()) {
    std::cout << "no plan fits in memory\n";
    return;
  }
  for (size_t i = 0; i < result.plans.size(); ++i) {
    const plan::Plan& p = result.plans[i];
    std::cout << "#" << i + 1 << "  " << seconds(p.predicted.step_seconds) << "/step  "
              << fixed(p.predicted.samples_per_second, "%.1f") << " samples/s  peak "
              << formatBytes(peakMemory(p)) << "  " << p.ranks.size() << " devices\n"
              << "    " << p.summary() << "\n    " << p.reason << "\n";
  }
  for (const auto* uniform : {&result.uniform_data_parallel, &result.uniform_pipeline})
    if (*uniform)
      std::cout << "uniform: " << seconds((*uniform)->predicted.step_seconds) << "/step  "
                << (*uniform)->summary() << "\n";
  if (result.gainOverUniform() > 0)
    std::cout << "gain over the best uniform plan: " << fixed(result.gainOverUniform(), "%.2f")
              << "x\n";
  printPlanDetail(result.plans.front(), cluster);
}

nlohmann::json resultJson(const plan::PlanResult& result, const plan::Cluster& cluster,
                          const plan::ModelProfile& model, int global_batch) {
  nlohmann::json plans = nlohmann::json::array();
  for (const auto& p : result.plans) plans.push_back(plan::toJson(p));
  nlohmann::json uniform = nlohmann::json::object();
  if (result.uniform_data_parallel)
    uniform["data_parallel"] = plan::toJson(*result.uniform_data_parallel);
  if (result.uniform_pipeline) uniform["pipeline"] = plan::toJson(*result.uniform_pipeline);
  return {{"cluster", cluster.name()},
          {"devices", result.devices},
          {"model", model.name},
          {"parameters", model.totalParams()},
          {"global_batch", global_batch},
          {"candidates", result.candidates},
          {"search_seconds", result.search_seconds},
          {"gain_over_uniform", result.gainOverUniform()},
          {"plans", plans},
          {"uniform", uniform}};
}

int runPlan(const PlanArgs& args) {
  const plan::Cluster cluster = plan::loadClusterFile(args.cluster);
  const plan::ModelProfile model = plan::resolveModel(args.model);
  plan::PlanOptions options;
  options.global_batch = args.global_batch;
  options.top_k = args.top;
  options.precision = plan::parsePrecisionPolicy(args.precision);
  options.allow_compression = args.allow_compression;
  options.allow_pipelines = !args.no_pipelines;
  if (args.gpipe) options.schedules = {plan::Schedule::kGpipe, plan::Schedule::kOneFOneB};
  const plan::PlanResult result = plan::planCluster(cluster, model, options);
  if (args.json)
    std::cout << resultJson(result, cluster, model, args.global_batch).dump(2) << std::endl;
  else
    printTable(result, cluster, model, args.global_batch);
  if (!args.out.empty() && !result.plans.empty()) {
    std::ofstream out(args.out);
    out << plan::toJson(result.plans.front()).dump(2) << "\n";
    if (!out) CHORUS_THROW(ConfigError, "cannot write the plan to '", args.out, "'");
  }
  return result.plans.empty() ? kExitFailure : kExitOk;
}

}  // namespace

void addPlanCommand(CLI::App& app, Action& action) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* command = app.add_subcommand(
      "plan", "Search parallel plans for a model on a described cluster (docs/planner.md)");
  command->add_option("--cluster", args->cluster, "Cluster description (TOML)")->required();
  command
      ->add_option("--model", args->model,
                   "A named shape (" + plan::knownModelNames() + ") or a JSON profile file")
      ->required();
  command->add_option("--global-batch", args->global_batch, "Samples per step")
      ->required()
      ->check(CLI::Range(1, 1 << 30));
  command->add_option("--top", args->top, "Plans to show")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  command->add_flag("--json", args->json, "Print JSON (with `devices`, `plans`, `uniform`)");
  command->add_option("--out", args->out, "Write the best plan here (for chorus simulate)");
  command->add_option("--precision", args->precision, "fp32, tf32 or mixed")->capture_default_str();
  command->add_flag("--allow-compression", args->allow_compression,
                    "Consider lossy fp16/int8 gradient compression across nodes");
  command->add_flag("--no-pipelines", args->no_pipelines, "Data parallelism only");
  command->add_flag("--gpipe", args->gpipe, "Also consider the GPipe schedule");
  command->callback([args, &action] { action = [args] { return runPlan(*args); }; });
}

}  // namespace chorus::cli
