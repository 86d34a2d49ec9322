// plan = "auto": the job's devices become a measured local cluster, its model a profile, and the
// planner's search, narrowed to what the trainers run, picks data parallelism with uneven shares,
// a pipeline or replicas of pipelines. The choice comes back as the planner's Plan, which the
// front end adopts as it is (job_plan.h, adoptPlan) and hands to every worker.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <sstream>

#include "chorus/core/error.h"
#include "chorus/plan/planner.h"
#include "chorus/runtime/job/auto_plan.h"
#include "chorus/runtime/job/compute_calibration.h"
#include "chorus/runtime/job/memory_calibration.h"
#include "chorus/runtime/job/pipeline_job.h"
#include "job/trained_model.h"

namespace chorus::runtime {
namespace {

bool computesInFp32(const JobConfig& job, const std::vector<DeviceSpec>& devices) {
  for (size_t rank = 0; rank < devices.size(); ++rank)
    if (precisionOf(job.precision, static_cast<int>(rank), devices[rank]) != "fp32") return false;
  return true;
}

// The first job setting that rules pipelines out (what checkParallel and checkElastic refuse
// with pipeline_stages > 1), or "" when a pipeline could run. Compression too: a pipeline takes it
// only with replicas, and the planner does not price codecs.
std::string pipelineBlocker(const JobConfig& job) {
  if (job.train.micro_batch != 0) return "train.micro_batch";
  if (job.zero.stage != 0) return "zero.stage";
  if (job.comm.sync_every != 1) return "comm.sync_every";
  if (job.comm.compression != "none") return "comm.compression";
  if (job.comm.algorithm != "flat") return "comm.algorithm";
  // An elastic pipeline's lost stage may come back only from a checkpoint.
  if (job.elastic.enabled && job.checkpoint.dir.empty()) return "elastic.enabled";
  return "";
}

plan::Cluster localCluster(const std::vector<DeviceSpec>& devices,
                           const std::vector<plan::MeasuredDevice>& measured) {
  CHORUS_CHECK_CONFIG(!devices.empty() && measured.size() == devices.size(),
                      "plan = \"auto\": ", measured.size(), " measured devices for ",
                      devices.size(), " device specs");
  plan::LocalCluster local;
  bool all_cpu = true;
  for (size_t i = 0; i < devices.size(); ++i) {
    const DeviceSpec& spec = devices[i];
    all_cpu = all_cpu && spec.kind == DeviceKind::kCpu;
    local.devices.push_back(plan::emulateDevice(measured[i], spec.toString(), spec.speed,
                                                spec.memory_budget.value_or(0)));
  }
  // As `chorus devices --cluster-toml` describes this node (docs/planner.md, "Planning the local
  // node"), built directly rather than written and read back.
  local.intra_link = all_cpu ? plan::measuredShmLink(measured.front().memory_bandwidth_gbs)
                             : *plan::findLinkType("pcie4");
  return plan::toCluster(local);
}

plan::CostOptions costOptions(const JobConfig& job) {
  plan::CostOptions cost;
  // A budget (`cpu/512MiB`) bounds what the counting allocator sees, tensors only, and workers
  // without one share the host's memory anyway: reserving the process's 1 GiB would only make
  // small budgets look full.
  cost.cpu_reserved_bytes = 0;
  // The trainers keep a tenth of a budget spare (maxMicroBatch, and ZeRO's shards by memory).
  cost.memory_headroom = 0.1;
  // The optimizer the job runs, in fp32 (the cost model's defaults are Adam's): bytes of state
  // (as the memory model counts them) and of traffic per parameter.
  cost.optimizer_state_bytes = optimizerStateBytes(job.optimizer);
  if (job.optimizer.name == "adamw")
    cost.optimizer_traffic_bytes = 28;  // read w, g, m, v; write w, m, v
  else if (job.optimizer.momentum > 0)
    cost.optimizer_traffic_bytes = 20;  // read w, g, m; write w, m
  else
    cost.optimizer_traffic_bytes = 12;  // read w, g; write w
  return cost;
}

// The CPU device types of `devices` (a local cluster names each by its spec).
std::vector<std::string> cpuTypes(const std::vector<DeviceSpec>& devices) {
  std::vector<std::string> types;
  for (const DeviceSpec& device : devices)
    if (device.kind == DeviceKind::kCpu) types.push_back(device.toString());
  return types;
}

// What the trainers run: every device (one worker each), no ZeRO (planJob tries it when nothing
// else fits), no compression, fp32 unless the job computes in 16 bits, and no activation
// checkpointing, which the data-parallel trainer lacks and the planner would place per stage where
// the pipeline trainer takes one mode for all.
plan::PlanOptions planOptions(const JobConfig& job, const plan::CostOptions& cost, bool pipelines,
                              bool fp32) {
  plan::PlanOptions options;
  options.global_batch = static_cast<int>(job.train.global_batch);
  options.top_k = 2;
  options.precision = fp32 ? plan::PrecisionPolicy::kFp32 : plan::PrecisionPolicy::kMixed;
  options.allow_compression = false;
  options.schedules = {plan::Schedule::kOneFOneB};
  options.max_zero_stage = 0;
  options.allow_checkpointing = false;
  options.allow_pipelines = pipelines;
  options.allow_dropping_devices = false;
  options.seed = job.seed;
  options.cost = cost;
  return options;
}

// The job's devices in the trainer's rank order for `plan`: rank = replica * S + stage.
std::vector<DeviceSpec> rankDevices(const plan::Plan& plan,
                                    const std::vector<DeviceSpec>& devices) {
  std::vector<DeviceSpec> ordered;
  for (const auto& replica : plan.replicas)
    for (const auto& stage : replica.stages)
      ordered.push_back(devices.at(plan.ranks.at(stage.rank).device));
  return ordered;
}

template <typename T>
std::string joined(const std::vector<T>& items, const char* separator) {
  std::ostringstream text;
  for (size_t i = 0; i < items.size(); ++i) text << (i ? separator : "") << items[i];
  return text.str();
}

std::vector<int> replicaShares(const plan::Plan& plan) {
  std::vector<int> shares;
  for (const auto& replica : plan.replicas) shares.push_back(replica.share);
  return shares;
}

std::vector<int> stageLayers(const plan::Plan& plan) {
  std::vector<int> counts;
  for (const auto& stage : plan.replicas.at(0).stages)
    counts.push_back(stage.last_layer - stage.first_layer);
  return counts;
}

// Each rank computes in the format the job's [precision] gives its device (as planOfJob's ranks
// do), counted in the trainers' rank order (replica by replica, stage by stage): the planner
// priced 16-bit compute under its policy, the job says which 16-bit format.
void takeJobPrecisions(plan::Plan& plan, const JobConfig& job,
                       const std::vector<DeviceSpec>& devices) {
  int rank = 0;
  for (const auto& replica : plan.replicas)
    for (const auto& stage : replica.stages) {
      plan::RankPlan& planned = plan.ranks.at(stage.rank);
      planned.precision =
          plan::parseDtype(precisionOf(job.precision, rank++, devices.at(planned.device)));
    }
}

std::string milliseconds(double seconds) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.1f ms", seconds * 1e3);
  return buffer;
}

std::string describe(const plan::Plan& plan) {
  std::ostringstream text;
  if (plan.stageCount() == 1) {
    text << "data parallel";
    if (plan.zero_stage > 0) text << " with ZeRO-" << plan.zero_stage;
    text << ", shares " << joined(replicaShares(plan), "/");
  } else {
    text << plan.replicas.size() << (plan.replicas.size() == 1 ? " pipeline" : " pipelines")
         << " of " << plan.stageCount() << " stages, layers " << joined(stageLayers(plan), "/")
         << ", " << plan.micro_batches << " micro-batches " << plan::toString(plan.schedule);
  }
  return text.str();
}

std::string summaryOf(const JobConfig& job, const plan::PlanResult& result,
                      const std::vector<DeviceSpec>& ordered, const std::string& left_out,
                      const std::string& zero_note) {
  const plan::Plan& best = result.plans.front();
  std::string line = "plan = auto: " + describe(best) + " on " + toString(ordered) +
                     ": predicted " + milliseconds(best.predicted.step_seconds) + "/step; " +
                     best.reason;
  if (result.plans.size() > 1)
    line += "; next best " + describe(result.plans[1]) + ", " +
            milliseconds(result.plans[1].predicted.step_seconds) + ": " + result.plans[1].reason;
  if (!left_out.empty()) line += "; pipelines not considered: " + left_out;
  if (!zero_note.empty()) line += "; ZeRO: " + zero_note;
  if (best.stageCount() == 1 && best.replicas.size() > 1)
    line += job.balancer.mode == "off" ? "; the planned shares stay fixed (balance = off)"
                                       : "; the balancer starts from the planned shares";
  return line;
}

// The first job setting that keeps ZeRO out of the plan (what checkZero or checkElastic would
// refuse with it, or what the planner does not price), or "" when the plan may shard.
std::string zeroBlocker(const JobConfig& job, const std::vector<DeviceSpec>& devices) {
  // Also zero.stage = 0: the job keeps its state replicated.
  if (job.zero.stage_given) return "zero.stage is set";
  if (job.comm.sync_every != 1) return "comm.sync_every is set";
  if (job.comm.compression != "none") return "comm.compression is set";
  if (job.comm.algorithm != "flat") return "comm.algorithm is set";
  if (job.elastic.enabled)
    return "elastic recovery brings a lost ZeRO slice back only from the last checkpoint";
  for (const DeviceSpec& device : devices)
    if (device.memory_budget.has_value() != devices.front().memory_budget.has_value())
      return "some devices have a memory budget and some do not";
  return "";
}

// ZeRO's gain is the sharded optimizer step and the larger micro-batches the freed memory allows;
// its cost, in stages 1 and 2, the parameter all-gather after the step, which nothing hides. Where
// the two nearly cancel, the cost model cannot tell them apart (bench/zero.py measured no
// difference between the stages on this host), and a replicated plan is what elastic recovery,
// local SGD and the hierarchical all-reduce accept: so ZeRO must be predicted this much faster.
constexpr double kZeroGain = 0.05;

struct ZeroChoice {
  bool take = false;
  std::string note;  // for the summary; "" when ZeRO had nothing to offer
};

ZeroChoice weighZero(const plan::PlanResult& replicated, const plan::PlanResult& sharded) {
  if (sharded.plans.empty() || sharded.plans.front().zero_stage == 0) return {};
  const plan::Plan& zero = sharded.plans.front();
  const std::string name = "ZeRO-" + std::to_string(zero.zero_stage);
  if (replicated.plans.empty()) return {true, "nothing fits replicated"};
  const double gain =
      replicated.plans.front().predicted.step_seconds / zero.predicted.step_seconds - 1;
  char percent[32];
  std::snprintf(percent, sizeof percent, "%+.1f%%", 100 * gain);
  if (gain >= kZeroGain)
    return {true, name + " predicted " + percent + " faster than " +
                      describe(replicated.plans.front()) + " (" +
                      milliseconds(replicated.plans.front().predicted.step_seconds) + ")"};
  return {false, name + " predicted " + milliseconds(zero.predicted.step_seconds) + ", " + percent +
                     " against this plan, under the " +
                     std::to_string(static_cast<int>(100 * kZeroGain)) + "% it must gain"};
}

}  // namespace

PlannedJob planJob(const JobConfig& job, const std::vector<DeviceSpec>& devices,
                   const std::vector<plan::MeasuredDevice>& measured,
                   const std::optional<ComputeCalibration>& calibration) {
  const plan::Cluster cluster = localCluster(devices, measured);
  const plan::ModelProfile model = jobModelProfile(job, "job model " + job.model.kind);
  const std::string blocker = pipelineBlocker(job);
  const bool fp32 = computesInFp32(job, devices);
  const std::string left_out = blocker.empty() ? "" : blocker + " is set";
  plan::CostOptions cost = costOptions(job);
  const std::vector<std::string> cpu_types = cpuTypes(devices);
  if (calibration)
    applyComputeCalibration(cost, *calibration, model, cpu_types,
                            cpu_types.size() == devices.size());
  // The planner's memory model is the one the pipeline cut and the micro-batch sizing use (the
  // job's calibrated profile and optimizer), so what it plans fits by their reckoning too.
  plan::PlanResult result =
      plan::planCluster(cluster, model, planOptions(job, cost, blocker.empty(), fp32));
  // ZeRO, where the job leaves [zero] to the plan and runs what ZeRO combines with: data
  // parallelism with ZeRO-1 to 3, shards sized as the run sizes them (by memory with budgets).
  const std::string zero_blocker = zeroBlocker(job, devices);
  std::string zero_note;
  if (zero_blocker.empty()) {
    plan::PlanOptions options = planOptions(job, cost, /*pipelines=*/false, fp32);
    options.max_zero_stage = 3;
    options.zero_in_pipelines = false;
    options.zero_shards =
        devices.front().memory_budget ? plan::ZeroShards::kMemory : plan::ZeroShards::kEven;
    plan::PlanResult sharded = plan::planCluster(cluster, model, options);
    const ZeroChoice choice = weighZero(result, sharded);
    zero_note = choice.note;
    if (choice.take) result = std::move(sharded);
  }
  if (result.plans.empty())
    CHORUS_THROW(ConfigError, "plan = \"auto\": no plan fits ", model.name, " with batch ",
                 job.train.global_batch, " on ", toString(devices), " (memory",
                 zero_blocker.empty() ? std::string(", ZeRO-1 to 3 included")
                                      : "; ZeRO not tried: " + zero_blocker,
                 ")");
  PlannedJob planned;
  planned.plan = result.plans.front();
  takeJobPrecisions(planned.plan, job, devices);
  // The profile the planner priced is the job's measured one: the workers size by it too
  // (adoptPlan measures only a plan that carries none).
  const bool budgets = std::any_of(devices.begin(), devices.end(),
                                   [](const DeviceSpec& device) { return device.memory_budget; });
  if (budgets) planned.plan.memory_profile = model;
  planned.summary = summaryOf(job, result, rankDevices(planned.plan, devices), left_out, zero_note);
  if (calibration) planned.summary += "; " + describeCalibration(*calibration, model);
  return planned;
}

}  // namespace chorus::runtime
