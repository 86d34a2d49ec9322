// Every config key is used or refused (the house rule: config that is accepted must do what it
// says, or be refused with a ConfigError; silently ignoring a combination is a bug).
//
// The keys are docs/cli.md's job-keys table, read at test time; each must have a row in kKeyRows
// below (and each row's key must be documented). Every row's values are set, one at a time, on top
// of a small job in every context (model mlp / cnn / gpt × optimizer sgd / adamw × data
// parallelism / a 2-stage pipeline on two CPU devices), read with readJobConfig and checked as
// `chorus train` checks a job before it starts (validateJobOnDevices / validatePipelineJob). Each
// (key, value, context) must either be refused with a ConfigError naming the key, or change what
// runs: the fingerprint of what the run reads (runFingerprint: every field of the typed JobConfig
// the context's engine reads; for model.* keys the built model: parameters, layer profile and a
// forward output in training mode) differs from the same context without the key.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "chorus/core/config.h"
#include "chorus/core/error.h"
#include "chorus/model/model_config.h"
#include "chorus/runtime/job/job_config.h"
#include "chorus/runtime/job/pipeline_job.h"
#include "chorus_version.h"

namespace chorus::runtime {
namespace {

// ---- The documented keys ---------------------------------------------------------------------

// Text in backticks, in order.
std::vector<std::string> backticked(const std::string& text) {
  std::vector<std::string> words;
  std::size_t at = 0;
  while ((at = text.find('`', at)) != std::string::npos) {
    const std::size_t end = text.find('`', at + 1);
    if (end == std::string::npos) break;
    words.push_back(text.substr(at + 1, end - at - 1));
    at = end + 1;
  }
  return words;
}

// `text` without what its parentheses hold (a key's choices: "`model.kind` (`mlp`, `cnn`)").
std::string withoutParentheses(const std::string& text) {
  std::string out;
  int depth = 0;
  for (char c : text) {
    if (c == '(') ++depth;
    if (depth == 0) out += c;
    if (c == ')' && depth > 0) --depth;
  }
  return out;
}

// The keys of one row of the table: `section.a`, `b`, `c` name section.a, section.b and
// section.c; `prefix.*` names prefix.s for each short form s the row gave before it, or, when it
// gave none, for each word in backticks of the meaning column (`model.*` ... | sizes: `hidden`).
std::vector<std::string> keysOfRow(const std::string& key_cell, const std::string& meaning) {
  std::vector<std::string> keys;
  std::vector<std::string> forms;  // the last part of each key of the current section
  bool short_forms = false;        // whether the row named one as a short form
  std::string section;
  for (const std::string& word : backticked(withoutParentheses(key_cell))) {
    const std::size_t dot = word.rfind('.');
    if (word.size() > 2 && word.compare(word.size() - 2, 2, ".*") == 0) {
      const std::string prefix = word.substr(0, word.size() - 2);
      for (const std::string& form : short_forms ? forms : backticked(withoutParentheses(meaning)))
        keys.push_back(prefix + "." + form);
    } else if (dot != std::string::npos) {
      keys.push_back(word);
      if (word.substr(0, dot) != section) forms.clear();
      section = word.substr(0, dot);
      forms.push_back(word.substr(dot + 1));
    } else {
      keys.push_back(section.empty() ? word : section + "." + word);
      if (!section.empty()) forms.push_back(word);
      short_forms = short_forms || !section.empty();
    }
  }
  return keys;
}

// Every key docs/cli.md's job-keys table (| key | meaning |) names, in order.
std::vector<std::string> documentedKeys() {
  std::ifstream file(std::string(CHORUS_SOURCE_DIR) + "/docs/cli.md");
  EXPECT_TRUE(file) << "cannot read docs/cli.md";
  std::vector<std::string> keys;
  std::string line;
  bool in_table = false;
  while (std::getline(file, line)) {
    if (!in_table) {
      in_table = line.rfind("| key | meaning |", 0) == 0;
      continue;
    }
    if (line.rfind("|", 0) != 0) break;
    if (line.rfind("|---", 0) == 0) continue;
    const std::size_t split = line.find('|', 1);
    if (split == std::string::npos) continue;
    for (const std::string& key : keysOfRow(line.substr(1, split - 1), line.substr(split + 1)))
      keys.push_back(key);
  }
  return keys;
}

// ---- The values each key is tested with ------------------------------------------------------

struct KeyRow {
  std::string key;
  // Values as --set writes them (`key=value`); a value the context's job already has is skipped.
  std::vector<std::string> values;
  // Settings the key needs to be read (checkpoint.dir for checkpoint.keep): set on the job the
  // value is compared with too. A context whose job they make invalid is skipped. A key usually
  // has a row without them (it must be refused there) and one with them.
  std::vector<std::string> with = {};
};

const std::string kDir = "/tmp/chorus-key-coverage";

const std::vector<KeyRow>& keyRows() {
  static const std::vector<KeyRow> rows = {
      {"devices", {"cpu@1.0,cpu@0.5", "cpu/512MiB,cpu"}},
      {"cpu_threads", {"2"}},
      {"balance", {"off", "static"}},
      {"plan", {"auto"}},
      {"seed", {"7"}},
      {"train.steps", {"20"}},
      {"train.global_batch", {"32", "1"}},
      {"train.micro_batch", {"4"}},
      {"train.eval_every", {"5", "0"}},
      {"train.eval_samples", {"100"}},
      {"train.target_accuracy", {"0.5"}},
      {"train.log_every", {"3"}},
      {"model.kind", {"mlp", "cnn", "gpt"}},
      {"model.hidden", {"[32]", "[]"}},
      {"model.channels", {"16"}},
      {"model.blocks", {"1"}},
      {"model.groups", {"4", "0"}},
      {"model.layers", {"2"}},
      {"model.width", {"64"}},
      {"model.heads", {"8"}},
      {"model.context", {"32"}},
      {"model.vocab", {"50"}},
      {"model.dropout", {"0.1"}},
      {"model.input_shape", {"[1, 16, 16]"}},
      {"model.classes", {"5"}},
      {"data.dataset", {"fashion-mnist", "text"}},
      {"data.dir", {"/usr/share/datasets/fashion-mnist/"}},
      {"data.dir", {"/usr/share/datasets/fashion-mnist/"}, {"data.dataset=fashion-mnist"}},
      {"data.path", {"/var/lib/chorus/data/../data/mobydick.txt"}},
      {"data.path", {"/var/lib/chorus/data/../data/mobydick.txt"}, {"data.dataset=text"}},
      {"data.size", {"512"}},
      {"data.size", {"512"}, {"data.dataset=fashion-mnist"}},
      {"data.test_fraction", {"0.2"}},
      {"data.test_fraction", {"0.2"}, {"data.dataset=text"}},
      {"optimizer.name", {"sgd", "adamw"}},
      {"optimizer.lr", {"0.01"}},
      {"optimizer.momentum", {"0.5"}},
      {"optimizer.weight_decay", {"0.01"}},
      {"optimizer.beta1", {"0.8"}},
      {"optimizer.beta2", {"0.99"}},
      {"optimizer.warmup_steps", {"5"}},
      {"optimizer.schedule", {"constant"}},
      {"optimizer.min_lr_ratio", {"0.2"}},
      {"optimizer.min_lr_ratio", {"0.2"}, {"optimizer.schedule=constant"}},
      {"comm.bucket_mb", {"5"}},
      {"comm.first_bucket_mb", {"2"}},
      {"comm.min_buckets", {"2"}},
      {"comm.overlap", {"false"}},
      // Read at run time only (the collectives' deadline): its typed field is what runs.
      {"comm.timeout_s", {"30"}},
      {"comm.algorithm", {"auto", "hierarchical", "2d"}},
      {"comm.compression", {"fp16", "bf16", "int8", "topk", "powersgd"}},
      {"comm.powersgd_rank", {"2"}},
      {"comm.powersgd_rank", {"2"}, {"comm.compression=powersgd"}},
      {"comm.topk_ratio", {"0.1"}},
      {"comm.topk_ratio", {"0.1"}, {"comm.compression=topk"}},
      {"comm.topk_ratio", {"0.1"}, {"comm.compression=int8"}},
      {"comm.error_feedback", {"false"}},
      {"comm.error_feedback", {"false"}, {"comm.compression=int8"}},
      {"comm.powersgd_iterations", {"2"}},
      {"comm.powersgd_iterations", {"2"}, {"comm.compression=powersgd"}},
      {"comm.powersgd_bf16_factors", {"true"}},
      {"comm.powersgd_bf16_factors", {"true"}, {"comm.compression=powersgd"}},
      {"comm.powersgd_min_compression_rate", {"3"}},
      {"comm.powersgd_min_compression_rate", {"3"}, {"comm.compression=powersgd"}},
      {"comm.powersgd_start_step", {"5"}},
      {"comm.powersgd_start_step", {"5"}, {"comm.compression=powersgd"}},
      {"comm.powersgd_start_step", {"5"}, {"comm.compression=fp16"}},
      {"comm.sync_every", {"4"}},
      {"comm.cpu_transport", {"gloo", "shm"}},
      {"balancer.profile_steps", {"5"}},
      {"balancer.min_gain", {"0.1"}},
      {"balancer.cooldown_steps", {"4"}},
      {"balancer.window", {"8"}},
      {"balancer.shares", {"[10, 6]"}},
      {"balancer.initial_shares", {"[10, 6]"}},
      {"balancer.leave_out", {"false"}},
      {"precision.default", {"bf16", "fp16"}},
      {"precision.cpu", {"bf16", "fp16"}},
      {"precision.cuda", {"bf16"}},
      {"precision.ranks", {R"(["bf16", "fp32"])", R"(["fp32"])"}},
      {"precision.tf32", {"true"}},
      {"precision.conv_tf32", {"false"}},
      {"precision.loss_scale.init", {"1024"}},
      {"precision.loss_scale.growth", {"4.0"}},
      {"precision.loss_scale.backoff", {"0.25"}},
      {"precision.loss_scale.interval", {"100"}},
      {"precision.loss_scale.cpu.init", {"1024"}},
      {"precision.loss_scale.cpu.growth", {"4.0"}},
      {"precision.loss_scale.cpu.backoff", {"0.25"}},
      {"precision.loss_scale.cpu.interval", {"100"}},
      {"precision.loss_scale.cuda.init", {"1024"}},
      {"precision.loss_scale.cuda.growth", {"4.0"}},
      {"precision.loss_scale.cuda.backoff", {"0.25"}},
      {"precision.loss_scale.cuda.interval", {"100"}},
      {"checkpoint.dir", {kDir}},
      {"checkpoint.every", {"5"}},
      {"checkpoint.every", {"5"}, {"checkpoint.dir=" + kDir}},
      {"checkpoint.keep", {"2"}},
      {"checkpoint.keep", {"2"}, {"checkpoint.dir=" + kDir}},
      {"checkpoint.async", {"true"}},
      {"checkpoint.async", {"true"}, {"checkpoint.dir=" + kDir}},
      {"checkpoint.at_end", {"false"}},
      {"checkpoint.at_end", {"false"}, {"checkpoint.dir=" + kDir}},
      {"zero.stage", {"1", "2", "3"}},
      {"zero.shards", {"even"}},
      {"zero.shards", {"even", "speed", "[0.75, 0.25]"}, {"zero.stage=1"}},
      {"zero.redundancy", {"1"}},
      {"zero.redundancy", {"1"}, {"zero.stage=1"}},
      {"zero.redundancy",
       {"1"},
       {"zero.stage=1", "elastic.enabled=true", "checkpoint.dir=" + kDir}},
      {"parallel.pipeline_stages", {"1", "2"}},
      {"parallel.replicas", {"2"}},
      {"parallel.replicas", {"2"}, {"devices=cpu,cpu,cpu,cpu"}},
      {"parallel.schedule", {"gpipe"}},
      {"parallel.micro_batches", {"4"}},
      {"parallel.partition", {"even", "[1, 2]"}},
      {"parallel.activation_checkpointing", {"stage", "layer"}},
      {"parallel.activations", {"fp32"}},
      {"parallel.recut", {"adaptive"}},
      {"parallel.recut_every", {"5"}},
      {"parallel.recut_every", {"5"}, {"parallel.recut=adaptive"}},
      {"parallel.recut_threshold", {"0.1"}},
      {"parallel.recut_threshold", {"0.1"}, {"parallel.recut=adaptive"}},
      // Read by the agent and the workers' monitors at run time: their typed fields are what runs.
      {"elastic.enabled", {"true"}},
      {"elastic.min_devices", {"2"}},
      {"elastic.min_devices", {"2"}, {"elastic.enabled=true"}},
      {"elastic.heartbeat_ms", {"500"}},
      {"elastic.heartbeat_ms", {"500"}, {"elastic.enabled=true"}},
      {"elastic.heartbeat_misses", {"5"}},
      {"elastic.heartbeat_misses", {"5"}, {"elastic.enabled=true"}},
      {"elastic.max_restarts", {"1"}},
      {"elastic.max_restarts", {"1"}, {"elastic.enabled=true"}},
  };
  return rows;
}

// ---- Contexts --------------------------------------------------------------------------------

struct Context {
  std::string model;      // mlp | cnn | gpt, at the model's default sizes
  std::string optimizer;  // sgd | adamw
  bool pipeline = false;  // parallel.pipeline_stages = 2

  std::string name() const {
    return model + "/" + optimizer + "/" + (pipeline ? "pipeline" : "data-parallel");
  }
  // The context's job as --set settings on an empty config.
  std::vector<std::string> settings() const {
    return {"devices=cpu,cpu",
            "train.steps=10",
            "train.global_batch=16",
            "model.kind=" + model,
            "data.dataset=synthetic",
            "optimizer.name=" + optimizer,
            std::string("parallel.pipeline_stages=") + (pipeline ? "2" : "1")};
  }
};

std::vector<Context> contexts() {
  std::vector<Context> all;
  for (const char* model : {"mlp", "cnn", "gpt"})
    for (const char* optimizer : {"sgd", "adamw"})
      for (bool pipeline : {false, true}) all.push_back({model, optimizer, pipeline});
  return all;
}

// ---- What a run reads ------------------------------------------------------------------------

// A field list ("name=value\n" each). Every field of JobConfig is written, except where the
// context's engine provably does not read it: then writing it would call an ignored key "used".
class Fields {
 public:
  template <typename Value>
  void add(const std::string& name, const Value& value) {
    out_ << name << "=" << value << "\n";
  }
  template <typename Value>
  void add(const std::string& name, const std::vector<Value>& values) {
    out_ << name << "=[";
    for (const Value& value : values) out_ << value << ",";
    out_ << "]\n";
  }
  std::string str() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

// A new field in a section must be added to runFingerprint (or to the reason it is left out);
// these sizes are of libstdc++ on x86-64 and fail the build when a field is added.
static_assert(sizeof(TrainSection) == 7 * 8, "a new [train] field: add it to runFingerprint");
static_assert(sizeof(DataSection) == 3 * 32 + 2 * 8, "a new [data] field");
static_assert(sizeof(OptimizerSection) == 2 * 32 + 7 * 8, "a new [optimizer] field");
// (+ `given`, a std::set of 48 bytes: which keys the job wrote, not a setting of the run)
static_assert(sizeof(CommSection) == 3 * 32 + 13 * 8 + 48, "a new [comm] field");
static_assert(sizeof(BalancerSection) == 32 + 4 * 8 + 2 * 24 + 8, "a new [balancer] field");
static_assert(sizeof(PrecisionSection) == 3 * 32 + 24 + 8 + 2 * 40, "a new [precision] field");
static_assert(sizeof(CheckpointSection) == 32 + 2 * 8 + 8, "a new [checkpoint] field");
static_assert(sizeof(ParallelSection) == 5 * 32 + 5 * 8, "a new [parallel] field");
static_assert(sizeof(ZeroSection) == 8 + 8 + 32 + 24 + 8, "a new [zero] field");
static_assert(sizeof(ElasticSection) == 5 * 8, "a new [elastic] field");
static_assert(sizeof(model::ModelConfig) == 32 + 2 * 24 + 10 * 8, "a new [model] field");
static_assert(sizeof(JobConfig) == 24 + 8 + 32 + 8 + sizeof(TrainSection) +
                                       sizeof(model::ModelConfig) + sizeof(DataSection) +
                                       sizeof(OptimizerSection) + sizeof(CommSection) +
                                       sizeof(BalancerSection) + sizeof(PrecisionSection) +
                                       sizeof(CheckpointSection) + sizeof(ParallelSection) +
                                       sizeof(ZeroSection) + sizeof(ElasticSection) + 2 * 32,
              "a new top-level JobConfig field");

void addLossScale(Fields& f, const std::string& name, const PrecisionSection::LossScale& scale) {
  f.add(name + ".init", scale.init);
  f.add(name + ".init_given", scale.init_given);
  f.add(name + ".growth", scale.growth);
  f.add(name + ".backoff", scale.backoff);
  f.add(name + ".interval", scale.interval);
}

// Every field of `job` that its run reads (not job.toml, which any key changes, nor
// job.source). Fields read only at run time in ways no fingerprint sees (comm.timeout_s,
// train.log_every, cpu_threads, the elastic heartbeat) count as what runs: the engine is handed
// the typed value. Left out where the engine does not read them (each a gap if accepted):
//  - checkpoint.every, keep, async, at_end without checkpoint.dir (nothing is written);
//  - the codec's knobs without their codec (engine_settings.cc's jobCodec builds none for "none";
//    powersgd_* are PowerSGD's, topk_ratio top-k's);
//  - data.dir, path, size, test_fraction of another data set (training_data.cc);
//  - in a pipeline: balancer.leave_out (pipeline_balancing.cc never leaves a replica out); with
//    one replica the gradient buckets (no gradient all-reduce: pipeline_engine.cc).
std::string runFingerprint(const JobConfig& job) {
  Fields f;
  f.add("devices", toString(job.devices));
  f.add("seed", job.seed);
  f.add("plan", job.plan);
  f.add("cpu_threads", job.cpu_threads);
  const TrainSection& train = job.train;
  f.add("train.steps", train.steps);
  f.add("train.global_batch", train.global_batch);
  f.add("train.micro_batch", train.micro_batch);
  f.add("train.eval_every", train.eval_every);
  f.add("train.eval_samples", train.eval_samples);
  f.add("train.target_accuracy", train.target_accuracy);
  f.add("train.log_every", train.log_every);
  const model::ModelConfig& model = job.model;
  f.add("model.kind", model.kind);
  f.add("model.input_shape", model.input_shape);
  f.add("model.classes", model.classes);
  f.add("model.hidden", model.hidden);
  f.add("model.channels", model.channels);
  f.add("model.blocks", model.blocks);
  f.add("model.groups", model.groups);
  f.add("model.vocab", model.vocab);
  f.add("model.layers", model.layers);
  f.add("model.width", model.width);
  f.add("model.heads", model.heads);
  f.add("model.context", model.context);
  f.add("model.dropout", model.dropout);
  const DataSection& data = job.data;
  f.add("data.dataset", data.dataset);
  if (data.dataset == "fashion-mnist") f.add("data.dir", data.dir);
  if (data.dataset == "text") f.add("data.path", data.path);
  if (data.dataset == "synthetic") f.add("data.size", data.size);
  if (data.dataset == "text") f.add("data.test_fraction", data.test_fraction);
  const OptimizerSection& opt = job.optimizer;
  f.add("optimizer.name", opt.name);
  f.add("optimizer.lr", opt.lr);
  f.add("optimizer.momentum", opt.momentum);
  f.add("optimizer.weight_decay", opt.weight_decay);
  f.add("optimizer.beta1", opt.beta1);
  f.add("optimizer.beta2", opt.beta2);
  f.add("optimizer.warmup_steps", opt.warmup_steps);
  f.add("optimizer.schedule", opt.schedule);
  f.add("optimizer.min_lr_ratio", opt.min_lr_ratio);
  const CommSection& comm = job.comm;
  const bool pipeline = job.parallel.pipeline_stages > 1;
  if (!pipeline || job.parallel.replicas > 1) {
    f.add("comm.bucket_mb", comm.bucket_mb);
    f.add("comm.first_bucket_mb", comm.first_bucket_mb);
    f.add("comm.min_buckets", comm.min_buckets);
    f.add("comm.overlap", comm.overlap);
  }
  f.add("comm.timeout_s", comm.timeout_s);
  f.add("comm.algorithm", comm.algorithm);
  f.add("comm.compression", comm.compression);
  if (comm.compression == "powersgd") {
    f.add("comm.powersgd_rank", comm.powersgd_rank);
    f.add("comm.powersgd_iterations", comm.powersgd_iterations);
    f.add("comm.powersgd_bf16_factors", comm.powersgd_bf16_factors);
    f.add("comm.powersgd_min_compression_rate", comm.powersgd_min_compression_rate);
    f.add("comm.powersgd_start_step", comm.powersgd_start_step);
  }
  if (comm.compression == "topk") f.add("comm.topk_ratio", comm.topk_ratio);
  if (comm.compression != "none") f.add("comm.error_feedback", comm.error_feedback);
  f.add("comm.sync_every", comm.sync_every);
  f.add("comm.cpu_transport", comm.cpu_transport);
  const BalancerSection& balancer = job.balancer;
  f.add("balance", balancer.mode);
  f.add("balancer.profile_steps", balancer.profile_steps);
  f.add("balancer.min_gain", balancer.min_gain);
  f.add("balancer.cooldown_steps", balancer.cooldown_steps);
  f.add("balancer.window", balancer.window);
  f.add("balancer.shares", balancer.shares);
  f.add("balancer.initial_shares", balancer.initial_shares);
  if (!pipeline) f.add("balancer.leave_out", balancer.leave_out);
  const PrecisionSection& precision = job.precision;
  f.add("precision.default", precision.fallback);
  f.add("precision.cpu", precision.cpu);
  f.add("precision.cuda", precision.cuda);
  f.add("precision.ranks", precision.ranks);
  f.add("precision.tf32", precision.tf32);
  f.add("precision.conv_tf32", precision.conv_tf32);
  addLossScale(f, "precision.loss_scale.cpu", precision.loss_scale_cpu);
  addLossScale(f, "precision.loss_scale.cuda", precision.loss_scale_cuda);
  const CheckpointSection& checkpoint = job.checkpoint;
  f.add("checkpoint.dir", checkpoint.dir);
  if (!checkpoint.dir.empty()) {
    f.add("checkpoint.every", checkpoint.every);
    f.add("checkpoint.keep", checkpoint.keep);
    f.add("checkpoint.async", checkpoint.async);
    f.add("checkpoint.at_end", checkpoint.at_end);
  }
  const ParallelSection& parallel = job.parallel;
  f.add("parallel.pipeline_stages", parallel.pipeline_stages);
  f.add("parallel.schedule", parallel.schedule);
  f.add("parallel.micro_batches", parallel.micro_batches);
  f.add("parallel.partition", parallel.partition);
  f.add("parallel.replicas", parallel.replicas);
  f.add("parallel.activation_checkpointing", parallel.activation_checkpointing);
  f.add("parallel.activations", parallel.activations);
  f.add("parallel.recut", parallel.recut);
  f.add("parallel.recut_every", parallel.recut_every);
  f.add("parallel.recut_threshold", parallel.recut_threshold);
  const ZeroSection& zero = job.zero;
  f.add("zero.stage", zero.stage);
  f.add("zero.stage_given", zero.stage_given);
  f.add("zero.shards", zero.shards);
  f.add("zero.fractions", zero.fractions);
  f.add("zero.redundancy", zero.redundancy);
  const ElasticSection& elastic = job.elastic;
  f.add("elastic.enabled", elastic.enabled);
  f.add("elastic.min_devices", elastic.min_devices);
  f.add("elastic.heartbeat_ms", elastic.heartbeat_ms);
  f.add("elastic.heartbeat_misses", elastic.heartbeat_misses);
  f.add("elastic.max_restarts", elastic.max_restarts);
  return f.str();
}

// The model the trainer builds for `job` (trainedModelConfig: a real data set decides the input
// shape and classes): its parameter count, layer profile and the sum and a few values of its
// forward output in training mode (dropout drawn from a fixed seed) on a fixed input. Jobs on the
// text corpus are not built (their vocabulary is the corpus's): "" then.
std::string modelFingerprint(const JobConfig& job) {
  model::ModelConfig config = job.model;
  if (job.data.dataset == "text") return "";
  if (job.data.dataset == "fashion-mnist") {
    config.input_shape = {1, 28, 28};
    config.classes = 10;
  }
  static std::map<std::string, std::string> built;  // by the config's fields
  Fields key;
  key.add("seed", job.seed);
  key.add("kind", config.kind);
  key.add("shape", config.input_shape);
  key.add("classes", config.classes);
  key.add("hidden", config.hidden);
  key.add("cnn", std::to_string(config.channels) + "," + std::to_string(config.blocks) + "," +
                     std::to_string(config.groups));
  key.add("gpt", std::to_string(config.vocab) + "," + std::to_string(config.layers) + "," +
                     std::to_string(config.width) + "," + std::to_string(config.heads) + "," +
                     std::to_string(config.context) + "," + std::to_string(config.dropout));
  auto found = built.find(key.str());
  if (found != built.end()) return found->second;
  const auto model = model::makeModel(config, job.seed);
  model->train();
  Fields f;
  f.add("parameters", model->parameterCount());
  for (const model::LayerProfile& layer : model->profile())
    f.add(layer.name, std::to_string(layer.parameters) + "," + std::to_string(layer.forward_flops) +
                          "," + std::to_string(layer.activation_bytes));
  torch::NoGradGuard no_grad;
  torch::manual_seed(3);
  at::Tensor input;
  if (config.kind == "gpt") {
    input = torch::arange(2 * config.context, torch::kLong).remainder(config.vocab).view({2, -1});
  } else {
    std::vector<std::int64_t> shape = {2};
    shape.insert(shape.end(), config.input_shape.begin(), config.input_shape.end());
    input = torch::randn(shape);
  }
  const at::Tensor output = model->forward(input).to(torch::kDouble).flatten();
  std::ostringstream values;
  values.precision(17);
  values << output.sum().item<double>() << "," << output.abs().sum().item<double>();
  f.add("output", values.str());
  return built[key.str()] = f.str();
}

// ---- One check -------------------------------------------------------------------------------

// The job `settings` describe, read and checked as `chorus train` does before it starts workers.
// Throws ConfigError.
JobConfig readAndValidate(const std::vector<std::string>& settings) {
  Config config = Config::parseString("", "job.toml");
  for (const std::string& setting : settings) config.set(setting);
  const JobConfig job = readJobConfig(config);
  if (job.parallel.pipeline_stages > 1)
    validatePipelineJob(job, job.devices);
  else
    validateJobOnDevices(job, job.devices);
  return job;
}

// Whether `message` names `key`: "config key 'KEY'", or KEY as a word of its own.
bool namesKey(const std::string& message, const std::string& key) {
  const auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (std::size_t at = message.find(key); at != std::string::npos;
       at = message.find(key, at + 1)) {
    const std::size_t end = at + key.size();
    const bool starts = at == 0 || (!word(message[at - 1]) && message[at - 1] != '.');
    const bool ends = end == message.size() || !word(message[end]);
    if (starts && ends) return true;
  }
  return false;
}

struct Tally {
  int checks = 0;
  int refused = 0;
  int changed = 0;
  int skipped = 0;  // a value the context already has, or a `with` the context refuses
  std::set<std::string> keys_checked;
};

void checkRow(const KeyRow& row, const Context& context, Tally& tally) {
  std::vector<std::string> base = context.settings();
  base.insert(base.end(), row.with.begin(), row.with.end());
  // The job without the key, once per (context, with): nullopt when the context refuses `with`.
  static std::map<std::vector<std::string>, std::optional<JobConfig>> bases;
  if (!bases.count(base)) {
    try {
      bases[base] = readAndValidate(base);
    } catch (const ConfigError&) {
      bases[base] = std::nullopt;
    }
  }
  if (!bases[base]) {
    tally.skipped += static_cast<int>(row.values.size());
    return;
  }
  const JobConfig& before = *bases[base];
  const bool model_key = row.key.rfind("model.", 0) == 0;
  const std::string run_before = runFingerprint(before);
  const std::string model_before = model_key ? modelFingerprint(before) : "";
  for (const std::string& value : row.values) {
    const std::string setting = row.key + "=" + value;
    if (std::find(base.begin(), base.end(), setting) != base.end()) {
      ++tally.skipped;
      continue;
    }
    std::vector<std::string> settings = base;
    settings.push_back(setting);
    std::string with;
    for (const std::string& extra : row.with) with += " " + extra;
    const std::string what =
        setting + (with.empty() ? "" : " with" + with) + " on " + context.name();
    ++tally.checks;
    tally.keys_checked.insert(row.key);
    try {
      const JobConfig after = readAndValidate(settings);
      if (model_key) {
        const std::string model_after = modelFingerprint(after);
        EXPECT_TRUE(model_after.empty() || model_after != model_before)
            << what << ": accepted, but the built model is the same";
        if (model_after.empty() || model_after != model_before) ++tally.changed;
      } else {
        EXPECT_TRUE(runFingerprint(after) != run_before)
            << what << ": accepted, but nothing the run reads changed";
        if (runFingerprint(after) != run_before) ++tally.changed;
      }
    } catch (const ConfigError& error) {
      const std::string message = error.message();
      EXPECT_EQ(message.find("unknown config key"), std::string::npos)
          << what << ": documented, but refused as unknown: " << message;
      EXPECT_TRUE(namesKey(message, row.key))
          << what << ": refused without naming " << row.key << ": " << message;
      ++tally.refused;
    }
  }
}

// ---- The tests -------------------------------------------------------------------------------

TEST(KeyCoverage, TheDocsTableNamesTheKeysItMeans) {
  EXPECT_EQ(keysOfRow(" `train.steps`, `global_batch` ", "x"),
            (std::vector<std::string>{"train.steps", "train.global_batch"}));
  EXPECT_EQ(keysOfRow(" `model.kind` (`mlp`, `cnn`) and `model.*` ", " sizes: `hidden`, `width` "),
            (std::vector<std::string>{"model.kind", "model.hidden", "model.width"}));
  EXPECT_EQ(keysOfRow(" `p.s.init`, `growth`; also `p.s.cpu.*` ", " m "),
            (std::vector<std::string>{"p.s.init", "p.s.growth", "p.s.cpu.init", "p.s.cpu.growth"}));
  EXPECT_EQ(keysOfRow(" `balance` ", " `off` (x) "), (std::vector<std::string>{"balance"}));
  EXPECT_TRUE(namesKey("config key 'model.width': x", "model.width"));
  EXPECT_FALSE(namesKey("config key 'precision.loss_scale.cpu.init': x", "precision.cpu"));
  EXPECT_FALSE(namesKey("config key 'zero.stage_given'", "zero.stage"));
}

// Every documented key has test values, and every tested key is documented.
TEST(KeyCoverage, EveryDocumentedKeyHasARowAndEveryRowIsDocumented) {
  const std::vector<std::string> documented = documentedKeys();
  ASSERT_GT(documented.size(), 90u) << "docs/cli.md's key table was not found or not parsed";
  std::set<std::string> tested;
  for (const KeyRow& row : keyRows()) tested.insert(row.key);
  const std::set<std::string> documented_set(documented.begin(), documented.end());
  for (const std::string& key : documented)
    EXPECT_TRUE(tested.count(key))
        << "docs/cli.md documents '" << key << "': add its test values to keyRows()";
  for (const std::string& key : tested)
    EXPECT_TRUE(documented_set.count(key))
        << "'" << key << "' is tested but not in docs/cli.md's table of config keys";
}

// The heart: every (key, value, context) is refused naming the key, or changes what runs.
TEST(KeyCoverage, EveryKeyIsUsedOrRefusedInEveryContext) {
  const std::vector<std::string> documented = documentedKeys();
  Tally tally;
  for (const Context& context : contexts())
    for (const KeyRow& row : keyRows()) checkRow(row, context, tally);
  for (const std::string& key : documented)
    EXPECT_TRUE(tally.keys_checked.count(key)) << key << " was checked in no context";
  std::cout << "[ key coverage ] " << documented.size() << " documented keys ("
            << tally.keys_checked.size() << " checked) x " << contexts().size()
            << " contexts: " << tally.checks << " checks, " << tally.refused << " refused naming "
            << "the key, " << tally.changed << " changed what runs, " << tally.skipped
            << " not applicable\n";
}

}  // namespace
}  // namespace chorus::runtime
