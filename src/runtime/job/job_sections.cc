#include "job/job_sections.h"

#include <algorithm>
#include <sstream>

#include "chorus/core/config_section.h"
#include "chorus/core/error.h"
#include "chorus/runtime/job/auto_plan.h"

namespace chorus::runtime {

void require(bool ok, const std::string& key, const std::string& what) {
  if (!ok) CHORUS_THROW(ConfigError, "config key '", key, "': ", what);
}

void requireChoice(const std::string& value, const std::string& key,
                   std::initializer_list<const char*> choices) {
  std::ostringstream list;
  for (const char* choice : choices) {
    if (value == choice) return;
    list << (list.tellp() > 0 ? ", " : "") << choice;
  }
  require(false, key, "'" + value + "' is unknown; expected " + list.str());
}

namespace {

void requirePrecisionName(const std::string& name, const std::string& key) {
  require(name == "fp32" || name == "bf16" || name == "fp16", key,
          "'" + name + "' is unknown; expected fp32, bf16 or fp16");
}

PrecisionSection::LossScale readLossScale(const Config& config, const std::string& table,
                                          PrecisionSection::LossScale scale) {
  readSection(config, table,
              {{"init", scale.init},
               {"growth", scale.growth},
               {"backoff", scale.backoff},
               {"interval", scale.interval}});
  scale.init_given = scale.init_given || config.has(table + ".init");
  require(scale.init > 0, table + ".init", "must be positive");
  require(scale.growth > 1, table + ".growth", "must be > 1");
  require(scale.backoff > 0 && scale.backoff < 1, table + ".backoff", "must be in (0, 1)");
  require(scale.interval >= 1, table + ".interval", "must be at least 1");
  return scale;
}

// "auto", "even", or layer counts: a TOML array [3, 5], or the string "3,5" that --set gives.
// Kept as the text PipelineOptions::partition takes.
std::string readPartition(const Config& config, const std::string& fallback) {
  const std::string key = "parallel.partition";
  std::string text;
  try {
    text = config.getString(key, fallback);
  } catch (const ConfigError&) {
    // Not a string: an array of layer counts (getInts names any other type).
    std::ostringstream joined;
    const auto counts = config.getInts(key, {});
    for (std::size_t i = 0; i < counts.size(); ++i) joined << (i ? "," : "") << counts[i];
    text = joined.str();
  }
  if (text == "auto" || text == "even") return text;
  std::istringstream in(text);
  std::string item;
  int items = 0;
  while (std::getline(in, item, ',')) {
    std::size_t used = 0;
    long long count = 0;
    try {
      count = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    require(!item.empty() && used == item.size() && count >= 1, key,
            "'" + text + "': expected \"auto\", \"even\" or positive layer counts like [3, 5]");
    ++items;
  }
  require(items > 0, key, "expected \"auto\", \"even\" or positive layer counts like [3, 5]");
  return text;
}

std::int64_t partitionStages(const std::string& partition) {
  if (partition == "auto" || partition == "even") return 0;
  return 1 + static_cast<std::int64_t>(std::count(partition.begin(), partition.end(), ','));
}

}  // namespace

PrecisionSection readPrecision(const Config& config) {
  PrecisionSection precision;
  readSection(config, "precision",
              {{"default", precision.fallback},
               {"cpu", precision.cpu},
               {"cuda", precision.cuda},
               {"ranks", precision.ranks},
               {"tf32", precision.tf32},
               {"conv_tf32", precision.conv_tf32}});
  requirePrecisionName(precision.fallback, "precision.default");
  if (!precision.cpu.empty()) requirePrecisionName(precision.cpu, "precision.cpu");
  if (!precision.cuda.empty()) requirePrecisionName(precision.cuda, "precision.cuda");
  for (const auto& name : precision.ranks) requirePrecisionName(name, "precision.ranks");
  const auto common = readLossScale(config, "precision.loss_scale", {});
  precision.loss_scale_cpu = readLossScale(config, "precision.loss_scale.cpu", common);
  precision.loss_scale_cuda = readLossScale(config, "precision.loss_scale.cuda", common);
  return precision;
}

CheckpointSection readCheckpoint(const Config& config) {
  CheckpointSection checkpoint;
  readSection(config, "checkpoint",
              {{"dir", checkpoint.dir},
               {"every", checkpoint.every},
               {"keep", checkpoint.keep},
               {"async", checkpoint.async},
               {"at_end", checkpoint.at_end}});
  require(checkpoint.every >= 0, "checkpoint.every", "must be >= 0 (0: only at the end)");
  require(checkpoint.keep >= 1, "checkpoint.keep", "must be at least 1");
  require(checkpoint.every == 0 || !checkpoint.dir.empty(), "checkpoint.every",
          "needs checkpoint.dir");
  // Without a directory no checkpoint is written: a job asking for background writes or for a
  // number to keep would silently get none.
  require(!checkpoint.async || !checkpoint.dir.empty(), "checkpoint.async", "needs checkpoint.dir");
  require(!config.has("checkpoint.keep") || !checkpoint.dir.empty(), "checkpoint.keep",
          "needs checkpoint.dir");
  require(!config.has("checkpoint.at_end") || !checkpoint.dir.empty(), "checkpoint.at_end",
          "needs checkpoint.dir");
  return checkpoint;
}

std::string precisionOf(const PrecisionSection& precision, int rank, const DeviceSpec& device) {
  if (!precision.ranks.empty()) {
    if (rank < static_cast<int>(precision.ranks.size())) return precision.ranks[rank];
    CHORUS_THROW(ConfigError, "config key 'precision.ranks': ", precision.ranks.size(),
                 " entries, but rank ", rank, " exists");
  }
  const std::string& kind = device.kind == DeviceKind::kCuda ? precision.cuda : precision.cpu;
  return kind.empty() ? precision.fallback : kind;
}

ParallelSection readParallel(const Config& config) {
  ParallelSection parallel;
  readSection(config, "parallel",
              {{"pipeline_stages", parallel.pipeline_stages},
               {"schedule", parallel.schedule},
               {"micro_batches", parallel.micro_batches}});
  parallel.partition = readPartition(config, parallel.partition);
  readSection(config, "parallel",
              {{"replicas", parallel.replicas},
               {"activation_checkpointing", parallel.activation_checkpointing},
               {"recut", parallel.recut},
               {"recut_every", parallel.recut_every},
               {"recut_threshold", parallel.recut_threshold}});
  require(parallel.pipeline_stages >= 1, "parallel.pipeline_stages",
          "must be at least 1 (1: plain data parallelism)");
  requireChoice(parallel.schedule, "parallel.schedule", {"1f1b", "gpipe"});
  require(parallel.micro_batches >= 1, "parallel.micro_batches", "must be at least 1");
  require(parallel.replicas >= 1, "parallel.replicas", "must be at least 1");
  requireChoice(parallel.activation_checkpointing, "parallel.activation_checkpointing",
                {"none", "stage", "layer"});
  parallel.activations = config.getString("parallel.activations", parallel.activations);
  requireChoice(parallel.activations, "parallel.activations", {"compute", "fp32"});
  const std::int64_t counted = partitionStages(parallel.partition);
  require(counted == 0 || counted == parallel.pipeline_stages, "parallel.partition",
          std::to_string(counted) + " layer counts for " +
              std::to_string(parallel.pipeline_stages) + " pipeline stages");
  requireChoice(parallel.recut, "parallel.recut", {"off", "adaptive"});
  require(parallel.recut_every >= 1, "parallel.recut_every", "must be at least 1");
  require(parallel.recut_threshold > 0 && parallel.recut_threshold < 1, "parallel.recut_threshold",
          "must be in (0, 1)");
  // A listed cut is the user's: moving it would silently override what the job says.
  require(parallel.recut == "off" || counted == 0, "parallel.recut",
          "\"adaptive\" moves the cut, but parallel.partition lists it; start from partition = "
          "\"auto\" or \"even\"");
  for (const char* key : {"parallel.recut_every", "parallel.recut_threshold"})
    require(!config.has(key) || parallel.recut == "adaptive", key,
            "needs parallel.recut = \"adaptive\"");
  return parallel;
}

void checkParallel(const JobConfig& job, const Config& config) {
  const ParallelSection& parallel = job.parallel;
  if (parallel.pipeline_stages == 1) {
    require(parallel.replicas == 1, "parallel.replicas",
            "needs parallel.pipeline_stages > 1 (plain data parallelism runs one replica per "
            "device)");
    // The data-parallel trainer reads none of these; a job that sets them would get none of it.
    require(parallel.activation_checkpointing == "none", "parallel.activation_checkpointing",
            "needs parallel.pipeline_stages > 1 (plain data parallelism keeps all activations)");
    require(!config.has("parallel.micro_batches"), "parallel.micro_batches",
            "needs parallel.pipeline_stages > 1; plain data parallelism splits a rank's share "
            "with train.micro_batch");
    require(!config.has("parallel.schedule"), "parallel.schedule",
            "needs parallel.pipeline_stages > 1 (there is no pipeline to schedule)");
    require(!config.has("parallel.activations"), "parallel.activations",
            "needs parallel.pipeline_stages > 1 (no activation crosses between stages)");
    require(parallel.recut == "off", "parallel.recut",
            "needs parallel.pipeline_stages > 1 (there is no cut to move)");
    return;
  }
  // The devices are counted where the job's are known: one node's by validatePipelineJob, several
  // nodes' by node 0 once they joined (a node's `devices` are its own).
  require(job.train.global_batch >= parallel.replicas * parallel.micro_batches,
          "train.global_batch",
          std::to_string(job.train.global_batch) + " cannot give each of " +
              std::to_string(parallel.replicas) + " pipeline replicas its " +
              std::to_string(parallel.micro_batches) +
              " micro-batches (parallel.micro_batches) of at least one sample");
  // What a pipeline does not combine with (yet): say so rather than silently ignore it.
  const std::string with = "is not supported with parallel.pipeline_stages > 1";
  require(job.train.micro_batch == 0, "train.micro_batch",
          with + "; parallel.micro_batches sets the micro-batches");
  require(job.balancer.shares.empty(), "balancer.shares",
          with + "; replica shares start from the devices' speeds and follow `balance`");
  require(job.balancer.initial_shares.empty(), "balancer.initial_shares",
          with + "; replica shares start from the devices' speeds");
  checkPipelineComm(job.comm, parallel.replicas);
}

void checkPipelineComm(const CommSection& comm, std::int64_t replicas) {
  const std::string with = "is not supported with parallel.pipeline_stages > 1";
  require(comm.sync_every == 1, "comm.sync_every", with);
  // Codecs compress each stage's all-reduce across the replicas; one replica has none.
  require(comm.compression == "none" || replicas > 1, "comm.compression",
          "needs parallel.replicas > 1 in a pipeline (a single pipeline all-reduces no "
          "gradients)");
  require(comm.algorithm == "flat", "comm.algorithm", with);
}

void rejectKeysAPipelineIgnores(const JobConfig& job, const Config& config) {
  // An elastic pipeline's survivors may go on as data parallelism (survivorStages,
  // survivor_plan.h), where the balancer may leave a device out and the buckets are all-reduced.
  if (job.parallel.pipeline_stages == 1 || job.elastic.enabled) return;
  // Replicas are never left out: each runs its micro-batches (pipeline_balancing.cc).
  require(!config.has("balancer.leave_out"), "balancer.leave_out",
          "is not supported with parallel.pipeline_stages > 1; every pipeline replica runs its "
          "micro-batches");
  // The gradient buckets are the replicas' all-reduce; one replica has none.
  for (const char* key :
       {"comm.bucket_mb", "comm.first_bucket_mb", "comm.min_buckets", "comm.overlap"})
    require(!config.has(key) || job.parallel.replicas > 1, key,
            "needs parallel.replicas > 1 in a pipeline (a single pipeline all-reduces no "
            "gradients)");
}

const std::vector<std::string>& autoPlanKeys() {
  static const std::vector<std::string> keys = {
      "parallel.pipeline_stages", "parallel.replicas",      "parallel.micro_batches",
      "parallel.schedule",        "parallel.partition",     "parallel.activation_checkpointing",
      "balancer.shares",          "balancer.initial_shares"};
  return keys;
}

void rejectPlannedKeys(const Config& config) {
  for (const std::string& key : autoPlanKeys())
    require(!config.has(key), key,
            "plan = \"auto\" chooses it; remove the key, or set plan = \"manual\" to keep it");
}

}  // namespace chorus::runtime
