#include "chorus/runtime/job/job_config.h"

#include "chorus/core/config_section.h"
#include "chorus/core/error.h"
#include "job/job_sections.h"

namespace chorus::runtime {
namespace {

TrainSection readTrain(const Config& config) {
  TrainSection train;
  readSection(config, "train",
              {{"steps", train.steps},
               {"global_batch", train.global_batch},
               {"micro_batch", train.micro_batch},
               {"eval_every", train.eval_every},
               {"eval_samples", train.eval_samples},
               {"target_accuracy", train.target_accuracy},
               {"log_every", train.log_every}});
  require(train.steps >= 1, "train.steps", "must be at least 1");
  require(train.global_batch >= 1, "train.global_batch", "must be at least 1");
  require(train.micro_batch >= 0, "train.micro_batch", "must be >= 0 (0: whole share)");
  require(train.eval_every >= 0, "train.eval_every", "must be >= 0 (0: only at the end)");
  require(train.eval_samples >= 0, "train.eval_samples", "must be >= 0 (0: the whole test set)");
  require(train.target_accuracy >= 0 && train.target_accuracy <= 1, "train.target_accuracy",
          "must be in [0, 1]");
  require(train.log_every >= 1, "train.log_every", "must be at least 1");
  return train;
}

// A key that only another kind reads would be accepted and change nothing: refused, naming the
// kinds that read it.
void requireKeysOfKind(const Config& config, const std::string& kind) {
  struct KeyUse {
    const char* key;
    std::initializer_list<const char*> kinds;
  };
  const KeyUse uses[] = {
      {"model.input_shape", {"mlp", "cnn"}},
      {"model.classes", {"mlp", "cnn"}},
      {"model.hidden", {"mlp"}},
      {"model.channels", {"cnn"}},
      {"model.blocks", {"cnn"}},
      {"model.groups", {"cnn"}},
      {"model.vocab", {"gpt"}},
      {"model.layers", {"gpt"}},
      {"model.width", {"gpt"}},
      {"model.heads", {"gpt"}},
      {"model.context", {"gpt"}},
      {"model.dropout", {"gpt"}},
  };
  for (const KeyUse& use : uses) {
    if (!config.has(use.key)) continue;
    std::string readers;
    bool read = false;
    for (const char* reader : use.kinds) {
      read = read || kind == reader;
      readers += (readers.empty() ? "" : " and ") + std::string(reader);
    }
    require(read, use.key,
            "is read by model.kind " + readers + " only, and this job's is '" + kind +
                "'; remove the key");
  }
}

model::ModelConfig readModel(const Config& config) {
  model::ModelConfig model;
  readSection(config, "model",
              {{"kind", model.kind},
               {"input_shape", model.input_shape},
               {"classes", model.classes},
               {"hidden", model.hidden},
               {"channels", model.channels},
               {"blocks", model.blocks},
               {"groups", model.groups},
               {"vocab", model.vocab},
               {"layers", model.layers},
               {"width", model.width},
               {"heads", model.heads},
               {"context", model.context},
               {"dropout", model.dropout}});
  model::validateModelConfig(model);
  requireKeysOfKind(config, model.kind);
  return model;
}

// The trainer takes a real data set's dimensions from the data (Fashion-MNIST's images and
// classes, the corpus's characters) and used to overwrite what the job said without a word: a
// job asking for 5 classes trained 10. A written value must agree with the data, or go.
void requireModelFitsData(const Config& config, const model::ModelConfig& model,
                          const DataSection& data) {
  if (data.dataset == "fashion-mnist") {
    const std::vector<std::int64_t> shape = {1, 28, 28};
    require(!config.has("model.classes") || model.classes == 10, "model.classes",
            std::to_string(model.classes) +
                " does not fit Fashion-MNIST, which has 10 classes; remove the key");
    require(!config.has("model.input_shape") || model.input_shape == shape, "model.input_shape",
            "does not fit Fashion-MNIST, whose images are [1, 28, 28]; remove the key");
  } else if (data.dataset == "text") {
    require(!config.has("model.vocab"), "model.vocab",
            "is taken from the corpus (data.dataset = \"text\": one token per distinct byte of " +
                data.path + "); remove the key");
  }
}

DataSection readData(const Config& config, const model::ModelConfig& model) {
  DataSection data;
  if (model.kind == "gpt") data.dataset = "text";
  readSection(config, "data",
              {{"dataset", data.dataset},
               {"dir", data.dir},
               {"path", data.path},
               {"size", data.size},
               {"test_fraction", data.test_fraction}});
  const bool tokens = model.kind == "gpt";
  if (data.dataset == "fashion-mnist" || data.dataset == "text") {
    require((data.dataset == "text") == tokens, "data.dataset",
            "'" + data.dataset + "' does not fit model.kind '" + model.kind +
                "' (gpt reads text; mlp and cnn read images)");
  } else {
    require(data.dataset == "synthetic", "data.dataset",
            "'" + data.dataset + "' is unknown; expected fashion-mnist, text or synthetic");
  }
  require(data.size >= 1, "data.size", "must be at least 1");
  require(data.test_fraction > 0 && data.test_fraction < 1, "data.test_fraction",
          "must be in (0, 1)");
  requireModelFitsData(config, model, data);
  // Each data set reads its own keys (training_data.cc); another's would be accepted and change
  // nothing.
  const struct {
    const char* key;
    const char* reader;
  } own[] = {{"data.dir", "fashion-mnist"},
             {"data.path", "text"},
             {"data.size", "synthetic"},
             {"data.test_fraction", "text"}};
  for (const auto& use : own)
    require(!config.has(use.key) || data.dataset == use.reader, use.key,
            "is read by data.dataset " + std::string(use.reader) + " only, and this job's is '" +
                data.dataset + "'; remove the key");
  return data;
}

OptimizerSection readOptimizer(const Config& config) {
  OptimizerSection opt;
  readSection(config, "optimizer",
              {{"name", opt.name},
               {"lr", opt.lr},
               {"momentum", opt.momentum},
               {"weight_decay", opt.weight_decay},
               {"beta1", opt.beta1},
               {"beta2", opt.beta2},
               {"warmup_steps", opt.warmup_steps},
               {"schedule", opt.schedule},
               {"min_lr_ratio", opt.min_lr_ratio}});
  require(opt.name == "sgd" || opt.name == "adamw", "optimizer.name",
          "'" + opt.name + "' is unknown; expected sgd or adamw");
  require(opt.lr > 0, "optimizer.lr", "must be positive");
  require(opt.momentum >= 0 && opt.momentum < 1, "optimizer.momentum", "must be in [0, 1)");
  require(opt.weight_decay >= 0, "optimizer.weight_decay", "must be >= 0");
  require(opt.beta1 >= 0 && opt.beta1 < 1, "optimizer.beta1", "must be in [0, 1)");
  require(opt.beta2 >= 0 && opt.beta2 < 1, "optimizer.beta2", "must be in [0, 1)");
  require(opt.warmup_steps >= 0, "optimizer.warmup_steps", "must be >= 0");
  require(opt.schedule == "cosine" || opt.schedule == "constant", "optimizer.schedule",
          "'" + opt.schedule + "' is unknown; expected cosine or constant");
  require(opt.min_lr_ratio >= 0 && opt.min_lr_ratio <= 1, "optimizer.min_lr_ratio",
          "must be in [0, 1]");
  require(opt.schedule == "cosine" || !config.has("optimizer.min_lr_ratio"),
          "optimizer.min_lr_ratio",
          "is where the cosine schedule ends; optimizer.schedule is '" + opt.schedule +
              "'; remove the key");
  // Keys the other optimizer reads would change nothing.
  require(opt.name == "sgd" || !config.has("optimizer.momentum"), "optimizer.momentum",
          "is SGD's; AdamW's moments are optimizer.beta1 and beta2; remove the key");
  for (const char* beta : {"optimizer.beta1", "optimizer.beta2"})
    require(opt.name == "adamw" || !config.has(beta), beta,
            "is AdamW's; SGD's is optimizer.momentum; remove the key");
  return opt;
}

CommSection readComm(const Config& config) {
  CommSection comm;
  readSection(config, "comm",
              {{"bucket_mb", comm.bucket_mb},
               {"first_bucket_mb", comm.first_bucket_mb},
               {"min_buckets", comm.min_buckets},
               {"overlap", comm.overlap},
               {"timeout_s", comm.timeout_s},
               {"algorithm", comm.algorithm},
               {"compression", comm.compression},
               {"powersgd_rank", comm.powersgd_rank},
               {"powersgd_iterations", comm.powersgd_iterations},
               {"powersgd_bf16_factors", comm.powersgd_bf16_factors},
               {"powersgd_min_compression_rate", comm.powersgd_min_compression_rate},
               {"powersgd_start_step", comm.powersgd_start_step},
               {"topk_ratio", comm.topk_ratio},
               {"error_feedback", comm.error_feedback},
               {"sync_every", comm.sync_every},
               {"cpu_transport", comm.cpu_transport}});
  for (const std::string& key : commKeysThePlanDecides())
    if (config.has("comm." + key)) comm.given.insert(key);
  checkComm(comm);
  return comm;
}

// Shares (when given) must cover the global batch exactly.
void requireSumsToBatch(const std::vector<std::int64_t>& shares, const char* key,
                        std::int64_t global_batch) {
  if (shares.empty()) return;
  std::int64_t total = 0;
  for (std::int64_t share : shares) total += share;
  require(total == global_batch, key,
          "must sum to train.global_batch (" + std::to_string(global_batch) + "), not " +
              std::to_string(total));
}

BalancerSection readBalancer(const Config& config) {
  BalancerSection balancer;
  balancer.mode = config.getString("balance", balancer.mode);
  readSection(config, "balancer",
              {{"profile_steps", balancer.profile_steps},
               {"min_gain", balancer.min_gain},
               {"cooldown_steps", balancer.cooldown_steps},
               {"window", balancer.window},
               {"leave_out", balancer.leave_out},
               {"shares", balancer.shares}});
  for (std::int64_t share : balancer.shares) require(share >= 0, "balancer.shares", "must be >= 0");
  balancer.initial_shares = config.getInts("balancer.initial_shares", balancer.initial_shares);
  for (std::int64_t share : balancer.initial_shares)
    require(share >= 0, "balancer.initial_shares", "must be >= 0");
  require(balancer.shares.empty() || balancer.initial_shares.empty(), "balancer.initial_shares",
          "cannot be combined with balancer.shares (fixed shares)");
  require(balancer.mode == "off" || balancer.mode == "static" || balancer.mode == "adaptive",
          "balance", "'" + balancer.mode + "' is unknown; expected off, static or adaptive");
  require(balancer.profile_steps >= 1, "balancer.profile_steps", "must be at least 1");
  require(balancer.min_gain >= 0 && balancer.min_gain < 1, "balancer.min_gain",
          "must be in [0, 1)");
  require(balancer.cooldown_steps >= 0, "balancer.cooldown_steps", "must be >= 0");
  require(balancer.window >= 2, "balancer.window", "must be at least 2");
  return balancer;
}

}  // namespace

JobConfig readJobConfig(const Config& config) {
  JobConfig job;
  job.source = config.source();
  job.devices = parseDeviceSpecs(config.getString("devices", "auto"));
  const std::int64_t seed = config.getInt("seed", static_cast<std::int64_t>(job.seed));
  require(seed >= 0, "seed", "must be >= 0");
  job.seed = static_cast<std::uint64_t>(seed);
  job.plan = config.getString("plan", job.plan);
  requireChoice(job.plan, "plan", {"manual", "auto"});
  job.cpu_threads = config.getInt("cpu_threads", job.cpu_threads);
  require(job.cpu_threads >= 0, "cpu_threads", "must be >= 0 (0 = the node's spare cores)");
  if (job.plan == "auto") rejectPlannedKeys(config);
  job.train = readTrain(config);
  job.model = readModel(config);
  job.data = readData(config, job.model);
  job.optimizer = readOptimizer(config);
  job.comm = readComm(config);
  job.balancer = readBalancer(config);
  job.precision = readPrecision(config);
  job.checkpoint = readCheckpoint(config);
  job.parallel = readParallel(config);
  job.zero = readZero(config);
  job.elastic = readElastic(config);
  requireSumsToBatch(job.balancer.shares, "balancer.shares", job.train.global_batch);
  requireSumsToBatch(job.balancer.initial_shares, "balancer.initial_shares",
                     job.train.global_batch);
  // Every step draws global_batch distinct samples; the workers' sampler would refuse this only
  // after they started.
  require(job.data.dataset != "synthetic" || job.train.global_batch <= job.data.size,
          "train.global_batch",
          std::to_string(job.train.global_batch) + " is larger than the synthetic data set (" +
              "data.size = " + std::to_string(job.data.size) + ")");
  checkParallel(job, config);
  checkZero(job);
  checkElastic(job);
  rejectKeysAPipelineIgnores(job, config);
  config.rejectUnknownKeys();
  job.toml = config.toToml();
  return job;
}

const char* defaultJobToml() {
  return R"(# The built-in default job: a small residual CNN on Fashion-MNIST, on every local device.
devices = "auto"
balance = "adaptive"
seed = 1

[train]
steps = 1500
global_batch = 64
eval_every = 100
eval_samples = 0
target_accuracy = 0.85
log_every = 20

# channels = 32, blocks = 2, groups = 8 (the defaults; not written, so that --set
# model.kind=gpt or mlp leaves no CNN key behind, which that kind would refuse)
[model]
kind = "cnn"

[data]
dataset = "fashion-mnist"

[optimizer]
name = "sgd"
lr = 0.05
# momentum = 0.9 (SGD's default; not written, so that --set optimizer.name=adamw works)
warmup_steps = 20
schedule = "cosine"
)";
}

}  // namespace chorus::runtime
