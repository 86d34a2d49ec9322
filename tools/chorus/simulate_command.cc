// `chorus simulate --cluster C.toml --plan PLAN.json [--model NAME] [--trace OUT.json] [--json]`:
// runs one step of a plan in the discrete-event simulator and prints the simulated step time
// next to the cost model's, per-rank utilization and bubble; --trace writes a Chrome-trace
// timeline (open it in https://ui.perfetto.dev).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "chorus/core/input_file.h"
#include "chorus/plan/cluster_file.h"
#include "chorus/plan/plan_json.h"
#include "chorus/plan/simulator.h"
#include "chorus/plan/transformer_shapes.h"
#include "commands.h"
#include "plan_inputs.h"

namespace chorus::cli {
namespace {

struct SimulateArgs {
  std::string cluster;
  std::string plan;
  std::string model;
  std::string trace;
  int index = 0;
  bool json = false;
  CostFlags cost;
};

// A plan file, or the answer of `chorus plan --json` (then plans[index]).
plan::Plan readPlan(const SimulateArgs& args) {
  const std::string text = readInputFile(args.plan, "plan file");
  const auto json = nlohmann::json::parse(text, nullptr, false);
  if (json.is_object() && json.contains("plans")) {
    CHORUS_CHECK_CONFIG(
        json["plans"].is_array() && args.index < static_cast<int>(json["plans"].size()), args.plan,
        ": has no plans[", args.index, "]");
    return plan::parsePlanJson(json["plans"][args.index].dump(2),
                               args.plan + " plans[" + std::to_string(args.index) + "]");
  }
  return plan::parsePlanJson(text, args.plan);
}

std::string percent(double value) {
  char buffer[16];
  std::snprintf(buffer, sizeof buffer, "%.1f%%", 100 * value);
  return buffer;
}

int runSimulate(const SimulateArgs& args) {
  const plan::Cluster cluster = plan::loadClusterFile(args.cluster);
  const plan::Plan plan = readPlan(args);
  const std::string model_name = args.model.empty() ? plan.model : args.model;
  CHORUS_CHECK_CONFIG(!model_name.empty(), args.plan, " names no model; pass --model");
  const plan::ModelProfile model = resolvePlanModel(model_name);
  plan::checkPlanAgainstCluster(plan, cluster);
  const plan::CostOptions options = costOptions(args.cost, cluster);
  const plan::CostModel cost(cluster, model, options);
  const plan::PlanCost predicted = cost.evaluate(plan);
  const plan::SimResult result = plan::simulate(cost, plan, {!args.trace.empty()});
  if (!args.trace.empty()) {
    std::ofstream out(args.trace);
    out << plan::chromeTrace(result, plan, cluster);
    if (!out) CHORUS_THROW(ConfigError, "cannot write the trace to '", args.trace, "'");
  }
  if (args.json) {
    nlohmann::json ranks = nlohmann::json::array();
    for (size_t i = 0; i < result.ranks.size(); ++i)
      ranks.push_back({{"rank", i},
                       {"device_type", cluster.device(plan.ranks[i].device).type.name},
                       {"busy_seconds", result.ranks[i].busy},
                       {"utilization", result.ranks[i].utilization},
                       {"bubble", result.ranks[i].bubble},
                       {"predicted_memory", predicted.memory[i]}});
    std::cout << nlohmann::json{{"devices", plan.ranks.size()},
                                {"simulated_step_seconds", result.step_seconds},
                                {"predicted_step_seconds", predicted.prediction.step_seconds},
                                {"bubble_fraction", result.bubble_fraction},
                                {"tasks", result.tasks},
                                {"fits_memory", predicted.feasible},
                                {"ranks", ranks}}
                     .dump(2)
              << std::endl;
    return kExitOk;
  }
  std::cout << "# " << plan.summary() << " on " << cluster.describe() << "\n"
            << "simulated step " << result.step_seconds << " s, cost model "
            << predicted.prediction.step_seconds << " s; bubble " << percent(result.bubble_fraction)
            << "; " << result.tasks << " tasks\n";
  if (!predicted.feasible) std::cout << "warning: " << predicted.infeasible_reason << "\n";
  std::cout << "rank  device        busy       util    bubble\n";
  for (size_t i = 0; i < result.ranks.size(); ++i) {
    char line[128];
    std::snprintf(line, sizeof line, "%-5zu %-13s %-10.4f %-7s %s\n", i,
                  cluster.device(plan.ranks[i].device).type.name.c_str(), result.ranks[i].busy,
                  percent(result.ranks[i].utilization).c_str(),
                  percent(result.ranks[i].bubble).c_str());
    std::cout << line;
  }
  if (!args.trace.empty()) std::cout << "trace written to " << args.trace << "\n";
  return kExitOk;
}

}  // namespace

void addSimulateCommand(CLI::App& app, Action& action) {
  auto args = std::make_shared<SimulateArgs>();
  CLI::App* command =
      app.add_subcommand("simulate", "Run one step of a plan in the discrete-event simulator");
  command->add_option("--cluster", args->cluster, "Cluster description (TOML)")->required();
  command
      ->add_option("--plan", args->plan, "A plan (chorus plan --out) or chorus plan --json output")
      ->required();
  command->add_option("--index", args->index, "Which plan of a chorus plan --json answer")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  command->add_option("--model", args->model,
                      "The model (name, *.json profile, or job *.toml), if not the one the plan "
                      "names");
  command->add_option("--trace", args->trace, "Write a Chrome-trace timeline (Perfetto) here");
  command->add_flag("--json", args->json, "Print JSON");
  addCostFlags(*command, args->cost);
  command->callback([args, &action] { action = [args] { return runSimulate(*args); }; });
}

}  // namespace chorus::cli
