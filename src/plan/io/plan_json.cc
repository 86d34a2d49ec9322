#include "chorus/plan/plan_json.h"

#include <limits>

#include "chorus/core/error.h"
#include "chorus/core/input_file.h"
#include "io/json_reader.h"
#include "io/model_json.h"

namespace chorus::plan {
namespace {

constexpr long long kMaxInt = std::numeric_limits<int>::max();
constexpr double kMaxBytes = 1152921504606846976.0;  // 2^60

// Parses an enum-valued string field, rethrowing the enum parser's message with the location.
template <typename Parse>
auto parseEnum(const JsonReader& reader, const std::string& pointer, const std::string& fallback,
               Parse parse) {
  const std::string text = reader.text(pointer, fallback);
  try {
    return parse(text);
  } catch (const ConfigError& error) {
    reader.fail(pointer, error.message());
  }
}

// A byte count: JSON gives a double, and one past 2^64 does not convert to std::uint64_t.
std::uint64_t bytes(const JsonReader& reader, const std::string& pointer) {
  const double value = reader.number(pointer, 0, 0);
  if (value > kMaxBytes) reader.fail(pointer, "must be at most 2^60 bytes (1 EiB)");
  return static_cast<std::uint64_t>(value);
}

nlohmann::json commJson(const CommPlan& comm) {
  const CodecOptions& codec = comm.codec;
  return {{"algorithm", planName(comm.algorithm)},
          {"inter_node_codec", toString(codec.kind)},
          {"int8_chunk", codec.int8_chunk},
          {"topk_ratio", codec.topk_ratio},
          {"powersgd_rank", codec.powersgd_rank},
          {"powersgd_min_elements", codec.powersgd_min_elements},
          {"powersgd_iterations", codec.powersgd_iterations},
          {"powersgd_bf16_factors", codec.powersgd_bf16_factors},
          {"powersgd_min_compression_rate", codec.powersgd_min_compression_rate},
          {"powersgd_start_step", codec.powersgd_start_step},
          {"error_feedback", codec.error_feedback},
          {"bucket_mb", comm.bucket_mb},
          {"first_bucket_mb", comm.first_bucket_mb},
          {"min_buckets", comm.min_buckets},
          {"overlap", comm.overlap},
          {"sync_period", comm.sync_period}};
}

// Every key but the algorithm is optional (plans written before the plan carried the runtime's
// settings have four keys); what is absent takes CommPlan's default, which is the job's.
CommPlan parseComm(const JsonReader& reader, std::uint64_t seed) {
  reader.object("/comm", {"algorithm", "intra_node_codec", "inter_node_codec", "int8_chunk",
                          "topk_ratio", "powersgd_rank", "powersgd_min_elements",
                          "powersgd_iterations", "powersgd_bf16_factors",
                          "powersgd_min_compression_rate", "powersgd_start_step", "error_feedback",
                          "bucket_mb", "first_bucket_mb", "min_buckets", "overlap", "sync_period"});
  // Nothing compresses inside a node (the engines' codec works where gradients cross nodes): an
  // older file's "none" is read, anything else refused rather than dropped.
  if (reader.text("/comm/intra_node_codec", "none") != "none")
    reader.fail("/comm/intra_node_codec",
                "must be \"none\": chorus compresses gradients only where they cross nodes");
  CommPlan comm;
  const CommPlan defaults;
  const CodecOptions& knobs = defaults.codec;
  CodecOptions& codec = comm.codec;
  comm.algorithm = parseEnum(reader, "/comm/algorithm", "ring", parsePlanAllReduceAlgorithm);
  codec.kind = parseEnum(reader, "/comm/inter_node_codec", "none", parseCodecKind);
  codec.seed = seed;
  codec.int8_chunk = reader.integer("/comm/int8_chunk", knobs.int8_chunk, 1, kMaxInt);
  codec.topk_ratio = reader.number("/comm/topk_ratio", knobs.topk_ratio, 0);
  codec.powersgd_rank =
      static_cast<int>(reader.integer("/comm/powersgd_rank", knobs.powersgd_rank, 1, kMaxInt));
  codec.powersgd_min_elements =
      reader.integer("/comm/powersgd_min_elements", knobs.powersgd_min_elements, 0,
                     std::numeric_limits<long long>::max());
  codec.powersgd_iterations = static_cast<int>(
      reader.integer("/comm/powersgd_iterations", knobs.powersgd_iterations, 1, kMaxInt));
  codec.powersgd_bf16_factors =
      reader.flag("/comm/powersgd_bf16_factors", knobs.powersgd_bf16_factors);
  codec.powersgd_min_compression_rate =
      reader.number("/comm/powersgd_min_compression_rate", knobs.powersgd_min_compression_rate, 1);
  codec.powersgd_start_step = static_cast<int>(
      reader.integer("/comm/powersgd_start_step", knobs.powersgd_start_step, 0, kMaxInt));
  codec.error_feedback = reader.flag("/comm/error_feedback", knobs.error_feedback);
  comm.bucket_mb = reader.number("/comm/bucket_mb", defaults.bucket_mb, 0);
  comm.first_bucket_mb = reader.number("/comm/first_bucket_mb", defaults.first_bucket_mb, 0);
  comm.min_buckets =
      static_cast<int>(reader.integer("/comm/min_buckets", defaults.min_buckets, 1, 1024));
  comm.overlap = reader.flag("/comm/overlap", defaults.overlap);
  comm.sync_period = static_cast<int>(reader.integer("/comm/sync_period", 1, 1, kMaxInt));
  return comm;
}

StagePlan parseStage(const JsonReader& reader, const std::string& at) {
  reader.object(at, {"first_layer", "last_layer", "rank", "micro_batch", "checkpoint"});
  for (const char* key : {"first_layer", "last_layer", "rank", "micro_batch"})
    reader.require(at + "/" + key);
  StagePlan stage;
  stage.first_layer = static_cast<int>(reader.integer(at + "/first_layer", 0, 0, kMaxInt));
  stage.last_layer = static_cast<int>(reader.integer(at + "/last_layer", 0, 1, kMaxInt));
  stage.rank = static_cast<int>(reader.integer(at + "/rank", 0, 0, kMaxInt));
  stage.micro_batch = static_cast<int>(reader.integer(at + "/micro_batch", 1, 1, kMaxInt));
  stage.checkpoint = reader.flag(at + "/checkpoint", false);
  return stage;
}

// A job device as its fields (never its text form, which only core/device_spec.h parses).
DeviceSpec parseSpec(const JsonReader& reader, const std::string& at) {
  reader.object(at, {"kind", "index", "speed", "memory_budget"});
  reader.require(at + "/kind");
  DeviceSpec spec;
  const std::string kind = reader.text(at + "/kind", "");
  if (kind != "cpu" && kind != "cuda") reader.fail(at + "/kind", "must be \"cpu\" or \"cuda\"");
  spec.kind = kind == "cpu" ? DeviceKind::kCpu : DeviceKind::kCuda;
  if (spec.kind == DeviceKind::kCuda) {
    reader.require(at + "/index");
    spec.index = static_cast<int>(reader.integer(at + "/index", 0, 0, kMaxInt));
  }
  spec.speed = reader.number(at + "/speed", 1, kMinEmulatedSpeed);
  if (spec.speed > 1) reader.fail(at + "/speed", "must be in [0.001, 1]");
  const std::uint64_t budget = bytes(reader, at + "/memory_budget");
  if (budget > 0) spec.memory_budget = budget;
  return spec;
}

nlohmann::json specJson(const DeviceSpec& spec) {
  nlohmann::json json = {{"kind", toString(spec.kind)}, {"speed", spec.speed}};
  if (spec.kind == DeviceKind::kCuda) json["index"] = spec.index;
  if (spec.memory_budget) json["memory_budget"] = *spec.memory_budget;
  return json;
}

RankPlan parseRank(const JsonReader& reader, const std::string& at) {
  reader.object(at, {"device", "device_type", "node", "precision", "memory_budget",
                     "emulated_speed", "predicted_memory", "spec"});
  reader.require(at + "/device");
  reader.require(at + "/precision");
  RankPlan rank;
  rank.device = static_cast<int>(reader.integer(at + "/device", 0, 0, kMaxInt));
  rank.device_type = reader.text(at + "/device_type", "");
  rank.node = reader.text(at + "/node", "");
  rank.precision = parseEnum(reader, at + "/precision", "fp32", parseDtype);
  rank.memory_budget = bytes(reader, at + "/memory_budget");
  rank.emulated_speed = reader.number(at + "/emulated_speed", 1, 0);
  if (rank.emulated_speed <= 0 || rank.emulated_speed > 1)
    reader.fail(at + "/emulated_speed", "must be in (0, 1]");
  rank.predicted_memory = bytes(reader, at + "/predicted_memory");
  if (reader.has(at + "/spec")) rank.spec = parseSpec(reader, at + "/spec");
  return rank;
}

}  // namespace

nlohmann::json toJson(const Prediction& p) {
  return {{"step_seconds", p.step_seconds},
          {"samples_per_second", p.samples_per_second},
          {"bubble_fraction", p.bubble_fraction},
          {"compute_seconds", p.compute_seconds},
          {"p2p_seconds", p.p2p_seconds},
          {"exposed_comm_seconds", p.exposed_comm_seconds},
          {"optimizer_seconds", p.optimizer_seconds}};
}

nlohmann::json toJson(const Plan& plan) {
  nlohmann::json replicas = nlohmann::json::array();
  for (const auto& replica : plan.replicas) {
    nlohmann::json stages = nlohmann::json::array();
    for (const auto& s : replica.stages)
      stages.push_back({{"first_layer", s.first_layer},
                        {"last_layer", s.last_layer},
                        {"rank", s.rank},
                        {"micro_batch", s.micro_batch},
                        {"checkpoint", s.checkpoint}});
    replicas.push_back({{"share", replica.share}, {"stages", stages}});
  }
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : plan.ranks) {
    ranks.push_back({{"device", r.device},
                     {"device_type", r.device_type},
                     {"node", r.node},
                     {"precision", toString(r.precision)},
                     {"memory_budget", r.memory_budget},
                     {"emulated_speed", r.emulated_speed},
                     {"predicted_memory", r.predicted_memory}});
    if (r.spec) ranks.back()["spec"] = specJson(*r.spec);
  }
  nlohmann::json json = {{"version", 1},
                         {"model", plan.model},
                         {"devices", plan.ranks.size()},
                         {"global_batch", plan.global_batch},
                         {"micro_batches", plan.micro_batches},
                         {"seed", plan.seed},
                         {"schedule", toString(plan.schedule)},
                         {"zero_stage", plan.zero_stage},
                         {"zero_shards", plan.zero_shards},
                         {"replicas", replicas},
                         {"ranks", ranks},
                         {"comm", commJson(plan.comm)},
                         {"predicted", toJson(plan.predicted)},
                         {"reason", plan.reason}};
  if (plan.memory_profile) json["memory_profile"] = modelProfileJson(*plan.memory_profile);
  return json;
}

Plan parsePlanJson(const std::string& text, const std::string& source) {
  const JsonReader reader(text, source);
  reader.object("", {"version", "model", "devices", "global_batch", "micro_batches", "seed",
                     "schedule", "zero_stage", "zero_shards", "replicas", "ranks", "comm",
                     "predicted", "reason", "memory_profile"});
  if (reader.integer("/version", 1, 1, 1) != 1) reader.fail("/version", "must be 1");
  reader.require("/global_batch");
  Plan plan;
  plan.model = reader.text("/model", "");
  plan.global_batch = static_cast<int>(reader.integer("/global_batch", 0, 1, kMaxInt));
  plan.micro_batches = static_cast<int>(reader.integer("/micro_batches", 1, 1, kMaxInt));
  plan.seed = static_cast<std::uint64_t>(
      reader.integer("/seed", 0, 0, std::numeric_limits<long long>::max()));
  plan.schedule = parseEnum(reader, "/schedule", "1f1b", parseSchedule);
  plan.zero_stage = static_cast<int>(reader.integer("/zero_stage", 0, 0, 3));
  if (reader.has("/zero_shards")) {
    const nlohmann::json& shards = reader.array("/zero_shards");
    for (size_t r = 0; r < shards.size(); ++r)
      plan.zero_shards.push_back(reader.number("/zero_shards/" + std::to_string(r), 0, 0));
  }
  const nlohmann::json& replicas = reader.array("/replicas");
  for (size_t r = 0; r < replicas.size(); ++r) {
    const std::string at = "/replicas/" + std::to_string(r);
    reader.object(at, {"share", "stages"});
    reader.require(at + "/share");
    ReplicaPlan replica;
    replica.share = static_cast<int>(reader.integer(at + "/share", 0, 1, kMaxInt));
    const nlohmann::json& stages = reader.array(at + "/stages");
    for (size_t s = 0; s < stages.size(); ++s)
      replica.stages.push_back(parseStage(reader, at + "/stages/" + std::to_string(s)));
    plan.replicas.push_back(std::move(replica));
  }
  const nlohmann::json& ranks = reader.array("/ranks");
  for (size_t i = 0; i < ranks.size(); ++i)
    plan.ranks.push_back(parseRank(reader, "/ranks/" + std::to_string(i)));
  if (reader.has("/devices") &&
      reader.integer("/devices", 0, 0, kMaxInt) != static_cast<long long>(plan.ranks.size()))
    reader.fail("/devices", "says " + std::to_string(reader.integer("/devices", 0, 0, kMaxInt)) +
                                " but 'ranks' lists " + std::to_string(plan.ranks.size()));
  if (reader.has("/comm")) plan.comm = parseComm(reader, plan.seed);
  if (reader.has("/memory_profile"))
    plan.memory_profile = readModelProfile(reader, "/memory_profile");
  if (reader.has("/predicted")) {
    reader.object("/predicted",
                  {"step_seconds", "samples_per_second", "bubble_fraction", "compute_seconds",
                   "p2p_seconds", "exposed_comm_seconds", "optimizer_seconds"});
    Prediction& p = plan.predicted;
    p.step_seconds = reader.number("/predicted/step_seconds", 0, 0);
    p.samples_per_second = reader.number("/predicted/samples_per_second", 0, 0);
    p.bubble_fraction = reader.number("/predicted/bubble_fraction", 0, 0);
    p.compute_seconds = reader.number("/predicted/compute_seconds", 0, 0);
    p.p2p_seconds = reader.number("/predicted/p2p_seconds", 0, 0);
    p.exposed_comm_seconds = reader.number("/predicted/exposed_comm_seconds", 0, 0);
    p.optimizer_seconds = reader.number("/predicted/optimizer_seconds", 0, 0);
  }
  plan.reason = reader.text("/reason", "");
  return plan;
}

Plan loadPlanFile(const std::string& path) {
  return parsePlanJson(readInputFile(path, "plan file"), path);
}

void checkPlanAgainstCluster(const Plan& plan, const Cluster& cluster) {
  std::vector<int> seen(cluster.size(), -1);
  for (size_t i = 0; i < plan.ranks.size(); ++i) {
    const RankPlan& rank = plan.ranks[i];
    CHORUS_CHECK_CONFIG(rank.device >= 0 && rank.device < cluster.size(), "plan rank ", i,
                        " names device ", rank.device, " but the cluster has ", cluster.size(),
                        " devices");
    CHORUS_CHECK_CONFIG(seen[rank.device] < 0, "plan ranks ", seen[rank.device], " and ", i,
                        " both use device ", rank.device);
    seen[rank.device] = static_cast<int>(i);
    const Device& device = cluster.device(rank.device);
    const std::string& node = cluster.nodes()[device.node].name;
    CHORUS_CHECK_CONFIG(rank.device_type.empty() || rank.device_type == device.type.name,
                        "plan rank ", i, " expects a ", rank.device_type, " as device ",
                        rank.device, " but the cluster has a ", device.type.name,
                        " there; was the plan made for another cluster?");
    CHORUS_CHECK_CONFIG(rank.node.empty() || rank.node == node, "plan rank ", i, " expects device ",
                        rank.device, " on node '", rank.node, "' but the cluster has it on '", node,
                        "'");
  }
}

}  // namespace chorus::plan
