// `chorus plan --cluster C.toml --model NAME --global-batch B [--top K] [--json] [--out
// PLAN.json]`: searches the parallel plans for a model on a described cluster and prints the best
// few with predicted step time, throughput, memory and why each wins or loses, next to the best
// uniform plans (equal shares, equal cuts) for the gain. `--shares` or `--cuts` price one plan
// fixed by hand instead (the split of a measured run, for validation); `--model JOB.toml` plans
// the zoo model a `chorus train` job trains. `--allreduce SIZE` prices one gradient all-reduce
// over the whole cluster instead (no model needed).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "chorus/core/units.h"
#include "chorus/plan/cluster_file.h"
#include "chorus/plan/comm_cost.h"
#include "chorus/plan/fixed_plan.h"
#include "chorus/plan/plan_json.h"
#include "chorus/plan/planner.h"
#include "chorus/plan/transformer_shapes.h"
#include "chorus/runtime/job/compute_calibration.h"
#include "chorus/runtime/job/job_config.h"
#include "commands.h"
#include "plan_inputs.h"

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
  std::string zero_shards = "memory";
  CostFlags cost;
  // Time the job's model on this host and price the CPU types with it (plan = "auto"'s
  // calibration), at this many intra-op threads.
  bool calibrate = false;
  int threads = 1;
  // One all-reduce priced alone: its size ("" = plan a model), algorithm and codec.
  std::string allreduce;
  std::string algorithm = "hierarchical";
  std::string compression = "none";
  // A plan fixed by hand: data-parallel shares, or pipeline cuts with micro-batches and schedule.
  std::vector<int> shares;
  int micro_batch = 0;
  std::vector<int> cuts;
  int micro_batches = 1;
  std::string schedule = "1f1b";
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

// The one plan --shares or --cuts fixes, priced, as a result of one plan.
plan::PlanResult fixedResult(const PlanArgs& args, const plan::Cluster& cluster,
                             const plan::ModelProfile& model, const plan::PlanOptions& options) {
  CHORUS_CHECK_CONFIG(args.shares.empty() || args.cuts.empty(),
                      "give --shares (data parallel) or --cuts (pipeline), not both");
  const plan::CostModel cost(cluster, model, options.cost);
  plan::PlanResult result;
  result.devices = cluster.size();
  if (!args.shares.empty()) {
    result.plans.push_back(
        plan::fixedDataParallelPlan(cost, args.shares, args.micro_batch, options.precision));
    CHORUS_CHECK_CONFIG(result.plans[0].global_batch == args.global_batch, "--shares sum to ",
                        result.plans[0].global_batch, ", not the global batch ", args.global_batch);
  } else {
    result.plans.push_back(
        plan::fixedPipelinePlan(cost, args.cuts, args.global_batch, args.micro_batches,
                                plan::parseSchedule(args.schedule), options.precision));
  }
  return result;
}

// `--allreduce SIZE`: one fp32 all-reduce of SIZE bytes per device over every device of the
// cluster, as the cost model prices a data-parallel group's gradient synchronization.
int runAllReducePrice(const PlanArgs& args, const plan::Cluster& cluster) {
  const std::uint64_t bytes = parseBytes(args.allreduce);
  std::vector<int> group(static_cast<size_t>(cluster.size()));
  for (int d = 0; d < cluster.size(); ++d) group[d] = d;
  const AllReduceAlgorithm algorithm = plan::parsePlanAllReduceAlgorithm(args.algorithm);
  const CodecKind codec = parseCodecKind(args.compression);
  const plan::LinearCost cost = plan::gradientAllReduceCost(
      cluster, group, algorithm, codec, /*element_bytes=*/4, args.cost.codec_ns_per_byte * 1e-9);
  const double total = cost.seconds(static_cast<double>(bytes));
  if (args.json) {
    const nlohmann::json answer = {{"devices", cluster.size()},
                                   {"bytes", bytes},
                                   {"algorithm", plan::planName(algorithm)},
                                   {"compression", toString(codec)},
                                   {"seconds", total},
                                   {"latency_seconds", cost.latency},
                                   {"seconds_per_byte", cost.per_byte}};
    std::cout << answer.dump(2) << std::endl;
  } else {
    std::cout << "all-reduce of " << formatBytes(bytes) << " over " << cluster.size()
              << " devices (" << plan::planName(algorithm) << ", " << toString(codec)
              << " across nodes): " << seconds(total) << " (latency " << seconds(cost.latency)
              << " + " << fixed(cost.per_byte * 1e9, "%.3f") << " ns/B)\n";
  }
  return kExitOk;
}

// --calibrate: the job file's model timed on this host (runtime/job/compute_calibration.h),
// applied to the cluster's CPU types.
void calibrateOnThisHost(const PlanArgs& args, const plan::Cluster& cluster,
                         const plan::ModelProfile& model, plan::CostOptions& cost) {
  CHORUS_CHECK_CONFIG(args.model.size() > 5 && args.model.rfind(".toml") == args.model.size() - 5,
                      "chorus plan: --calibrate times the model of a job file (--model JOB.toml), "
                      "not '",
                      args.model, "'");
  CHORUS_CHECK_CONFIG(args.cost.calibrations.empty() && args.cost.layer_overhead_us == 30,
                      "chorus plan: --calibrate measures what --calibration and "
                      "--layer-overhead-us set; give one or the other");
  std::vector<std::string> cpu_types;
  for (const auto& type : cluster.types())
    if (type.device_class == plan::DeviceClass::kCpu) cpu_types.push_back(type.name);
  CHORUS_CHECK_CONFIG(!cpu_types.empty(), "chorus plan: --calibrate prices CPU types, and ",
                      args.cluster, " has none");
  const runtime::ComputeCalibrationOptions options =
      runtime::ComputeCalibrationOptions::forJob(args.global_batch, args.threads);
  const runtime::JobConfig job = runtime::readJobConfig(Config::parseFile(args.model));
  const runtime::ComputeCalibration calibration = runtime::calibrateJobCompute(job, options);
  runtime::applyComputeCalibration(cost, calibration, model, cpu_types,
                                   cpu_types.size() == cluster.types().size());
  std::cerr << "chorus plan: " << runtime::describeCalibration(calibration, model) << std::endl;
}

int runPlan(const PlanArgs& args) {
  const plan::Cluster cluster = plan::loadClusterFile(args.cluster);
  if (!args.allreduce.empty()) return runAllReducePrice(args, cluster);
  CHORUS_CHECK_CONFIG(!args.model.empty() && args.global_batch > 0,
                      "chorus plan: --model and --global-batch are required (or --allreduce SIZE "
                      "to price one all-reduce)");
  const plan::ModelProfile model = resolvePlanModel(args.model);
  plan::PlanOptions options;
  options.global_batch = args.global_batch;
  options.top_k = args.top;
  options.precision = plan::parsePrecisionPolicy(args.precision);
  options.allow_compression = args.allow_compression;
  options.allow_pipelines = !args.no_pipelines;
  if (args.gpipe) options.schedules = {plan::Schedule::kGpipe, plan::Schedule::kOneFOneB};
  options.zero_shards =
      args.zero_shards == "even" ? plan::ZeroShards::kEven : plan::ZeroShards::kMemory;
  options.cost = costOptions(args.cost, cluster);
  if (args.calibrate) calibrateOnThisHost(args, cluster, model, options.cost);
  const bool fixed = !args.shares.empty() || !args.cuts.empty();
  const plan::PlanResult result = fixed ? fixedResult(args, cluster, model, options)
                                        : plan::planCluster(cluster, model, options);
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
  command->add_option("--model", args->model,
                      "A named shape (" + plan::knownModelNames() +
                          "), a JSON profile file, or a chorus train job file (*.toml); required "
                          "unless --allreduce");
  command->add_option("--global-batch", args->global_batch, "Samples per step (with --model)")
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
  command
      ->add_option("--zero-shards", args->zero_shards,
                   "How data-parallel ZeRO plans size their shards: memory (each device's share "
                   "of the sharded state by the memory it has left, as zero.shards = \"memory\" "
                   "runs them) or even")
      ->check(CLI::IsMember({"memory", "even"}))
      ->capture_default_str();
  addCostFlags(*command, args->cost);
  command->add_flag("--calibrate", args->calibrate,
                    "Time the job file's model on this host and price the CPU types with it "
                    "(instead of --calibration and --layer-overhead-us)");
  command->add_option("--threads", args->threads, "With --calibrate: intra-op threads")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_option("--allreduce", args->allreduce,
                      "Price one fp32 all-reduce of SIZE bytes per device (e.g. 64M) over the "
                      "whole cluster instead of planning a model");
  command->add_option("--algorithm", args->algorithm, "With --allreduce: ring or hierarchical")
      ->capture_default_str();
  command
      ->add_option("--compression", args->compression,
                   "With --allreduce: none, fp16, bf16 or int8 where it crosses nodes")
      ->capture_default_str();
  command
      ->add_option("--shares", args->shares,
                   "Price this data-parallel split (one share per device, in order) instead of "
                   "searching")
      ->delimiter(',');
  command
      ->add_option("--micro-batch", args->micro_batch,
                   "With --shares: largest micro-batch (0: each share in one pass)")
      ->check(CLI::Range(0, 1 << 30))
      ->capture_default_str();
  command
      ->add_option("--cuts", args->cuts,
                   "Price this pipeline (stage s on device s over layers [cut s, cut s+1)) "
                   "instead of searching")
      ->delimiter(',');
  command->add_option("--micro-batches", args->micro_batches, "With --cuts: micro-batches per step")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  command->add_option("--schedule", args->schedule, "With --cuts: gpipe or 1f1b")
      ->capture_default_str();
  command->callback([args, &action] { action = [args] { return runPlan(*args); }; });
}

}  // namespace chorus::cli
