// The configuration of a training job (`chorus train`), read once from TOML plus --set overrides
// and validated before anything starts: an unknown key, a wrong type or an impossible value is a
// ConfigError naming the key.
//
//   devices = "cpu@1.0,cpu@0.5"      balance = "adaptive"      seed = 1      plan = "manual"
//   cpu_threads = 0
//   [train]     steps, global_batch, micro_batch, eval_every, target_accuracy, log_every
//   [model]     kind = "mlp" | "cnn" | "gpt" and its sizes (model/model_config.h)
//   [data]      dataset = "fashion-mnist" | "text" | "synthetic", dir, path, size, test_fraction
//   [optimizer] name = "sgd" | "adamw", lr, momentum, weight_decay, betas, warmup_steps, schedule
//   [comm]      bucket_mb, overlap, timeout_s
//   [balancer]  profile_steps, min_gain, cooldown_steps, window
//   [precision] default, cpu, cuda, ranks, tf32, [precision.loss_scale] init, growth, backoff,
//               interval
//   [checkpoint] dir, every, keep, async
//   [parallel]  pipeline_stages, schedule, micro_batches, partition, replicas,
//               activation_checkpointing (pipeline_stages > 1: a pipeline plan)
//
// `plan = "auto"` leaves [parallel] and balancer.shares to the planner (auto_plan.h).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "chorus/core/config.h"
#include "chorus/core/device_spec.h"
#include "chorus/model/model_config.h"

namespace chorus::runtime {

struct TrainSection {
  std::int64_t steps = 300;          // Default: 300 (stops earlier at target_accuracy)
  std::int64_t global_batch = 64;    // Default: 64 samples per step, summed over ranks (B)
  std::int64_t micro_batch = 0;      // Default: 0 = a rank's whole share in one pass
  std::int64_t eval_every = 50;      // Default: 50 steps; 0 = only at the end
  std::int64_t eval_samples = 2000;  // Default: 2000 test samples per evaluation (0 = all)
  double target_accuracy = 0.0;      // Default: 0 = none; else stop once reached
  std::int64_t log_every = 10;       // Default: a progress line every 10 steps
};

struct DataSection {
  std::string dataset = "fashion-mnist";                   // Default: "fashion-mnist"
  std::string dir = "/usr/share/datasets/fashion-mnist";   // Default: Debian's location
  std::string path = "/var/lib/chorus/data/mobydick.txt";  // Default: the text set up by setup
  std::int64_t size = 4096;                                // Default: 4096 samples (synthetic only)
  double test_fraction = 0.1;                              // Default: 0.1 (text only)
};

struct OptimizerSection {
  std::string name = "sgd";         // Default: "sgd" (with momentum); or "adamw"
  double lr = 0.05;                 // Default: 0.05 (peak, after warmup)
  double momentum = 0.9;            // Default: 0.9 (sgd)
  double weight_decay = 0.0;        // Default: 0
  double beta1 = 0.9;               // Default: 0.9 (adamw)
  double beta2 = 0.999;             // Default: 0.999 (adamw)
  std::int64_t warmup_steps = 0;    // Default: 0
  std::string schedule = "cosine";  // Default: "cosine" to min_lr_ratio·lr; or "constant"
  double min_lr_ratio = 0.1;        // Default: 0.1
};

struct CommSection {
  // Gradient buckets (parallel::ReducerOptions has the rule and its why): the first bucket
  // launched holds at most first_bucket_mb, later ones bucket_mb, and every bucket at most 1 /
  // min_buckets of the model's gradients (but not below 32 KiB), so every model gets several.
  double bucket_mb = 25.0;       // Default: 25 MiB per gradient bucket (DDP's bucket_cap_mb)
  double first_bucket_mb = 1.0;  // Default: 1 MiB (DDP's first bucket)
  std::int64_t min_buckets = 4;  // Default: 4; 1 keeps DDP's sizes alone
  bool overlap = true;           // Default: all-reduce buckets during backward
  double timeout_s = 60.0;       // Default: 60 s deadline of every collective
  // Gradient all-reduce: "flat" | "auto" | "hierarchical" | "2d" (comm/hierarchical_all_reduce.h;
  // groups = hosts). Default: "flat", one all-reduce over all ranks.
  std::string algorithm = "flat";
  // Codec where gradients cross hosts (among host leaders; among all ranks when flat):
  // "none" | "fp16" | "bf16" | "int8" | "topk" | "powersgd" (parallel/compression.h).
  // Default: "none".
  std::string compression = "none";
  std::int64_t powersgd_rank = 4;  // Default: 4
  // PowerSGD's other knobs (parallel::CodecOptions has the why of each). Two iterations with bf16
  // factors send the same bytes as one in fp32 and follow the gradient more closely.
  std::int64_t powersgd_iterations = 1;        // Default: 1 (the paper's)
  bool powersgd_bf16_factors = false;          // Default: false
  double powersgd_min_compression_rate = 2.0;  // Default: 2 (PyTorch's)
  std::int64_t powersgd_start_step = 0;        // Default: 0 (compressed from the first step)
  double topk_ratio = 0.01;                    // Default: 1% of each bucket
  bool error_feedback = true;  // Default: true (lossy codecs carry what they dropped)
  // Synchronize every N steps (local SGD: in between each rank steps on its own gradients, then
  // parameters are averaged weighted by samples). Default: 1 = every step.
  std::int64_t sync_every = 1;
  // CPU transport of the communicator: "auto" | "gloo" | "shm". Default: "auto".
  std::string cpu_transport = "auto";
  // The keys above that a plan decides (all but timeout_s and cpu_transport) which the job wrote,
  // without the "comm." prefix: a plan made elsewhere may replace only the others
  // (commUnderPlan). Default: none.
  std::set<std::string> given;
};

struct BalancerSection {
  std::string mode = "adaptive";    // top-level `balance`: "off" | "static" | "adaptive"
  std::int64_t profile_steps = 3;   // Default: 3
  double min_gain = 0.0;            // Default: 0 (see plan::BalancerOptions)
  std::int64_t cooldown_steps = 2;  // Default: 2
  std::int64_t window = 16;         // Default: 16
  // Fixed shares, one per rank, summing to the global batch; the balancer is then not used.
  // Default: none.
  std::vector<std::int64_t> shares;
  // Shares to start from instead of an equal split (what plan = "auto" sets); `static` and
  // `adaptive` refine them from measurements, `off` keeps them. One per rank, summing to the
  // global batch. Default: none (equal).
  std::vector<std::int64_t> initial_shares;
  // Whether a device whose one sample would make it the straggler is left out (share 0) until
  // the others slow down (plan::BalancerOptions::leave_out). Default: true.
  bool leave_out = true;
};

// Compute precision per device (parallel/precision.h): a rank takes `ranks[rank]` when given,
// else the entry of its device kind, else `default`. Parameters, optimizer and gradient reduction
// stay fp32 whatever the compute format.
struct PrecisionSection {
  std::string fallback = "fp32";   // key `precision.default`; Default: "fp32"
  std::string cpu;                 // Default: "" (use the default); "bf16" is fast on recent CPUs
  std::string cuda;                // Default: "" (use the default)
  std::vector<std::string> ranks;  // Default: none; one entry per rank overrides the kinds
  // TF32 tensor cores on CUDA for fp32 matrix products. Default: false, as PyTorch's
  // torch.backends.cuda.matmul.allow_tf32.
  bool tf32 = false;
  // TF32 tensor cores on CUDA for fp32 convolutions (cuDNN). Default: true, as PyTorch's
  // torch.backends.cudnn.allow_tf32: a user comparing chorus with a plain PyTorch loop gets the
  // same numerics.
  bool conv_tf32 = true;
  // Dynamic loss scaling of fp16 ranks (PyTorch GradScaler's defaults), [precision.loss_scale];
  // [precision.loss_scale.cpu] / [precision.loss_scale.cuda] override them per device kind.
  struct LossScale {
    // Default: 2^16; 2^12 for a GPU older than Ampere (compute capability below 8: V100, T4),
    // whose fp16 gradients overflow more often from 2^16, each overflow a skipped step.
    double init = 65536.0;
    bool init_given = false;       // whether the job set init (then it holds on every device)
    double growth = 2.0;           // Default: 2.0
    double backoff = 0.5;          // Default: 0.5
    std::int64_t interval = 2000;  // Default: 2000 clean steps
  };
  LossScale loss_scale_cpu;
  LossScale loss_scale_cuda;
};

// Checkpoints (runtime/checkpoint.h). Without `dir` none are written.
struct CheckpointSection {
  std::string dir;         // Default: "" = no checkpoints
  std::int64_t every = 0;  // Default: 0 = only at the end and on SIGTERM/SIGINT; else every N steps
  std::int64_t keep = 3;   // Default: the newest 3 are kept
  bool async = false;      // Default: false; true = snapshot in memory, write in the background
  bool at_end = true;      // Default: true; a checkpoint after the last step
};

// Pipeline and hybrid (replicas × stages) parallelism (parallel/pipeline.h, docs/pipeline.md).
// With pipeline_stages > 1 the Trainer runs the job's pipeline plan on exactly
// pipeline_stages × replicas devices; rank = replica · pipeline_stages + stage.
struct ParallelSection {
  std::int64_t pipeline_stages = 1;  // Default: 1 = plain data parallelism (runtime::Trainer)
  std::string schedule = "1f1b";     // Default: "1f1b"; or "gpipe"
  std::int64_t micro_batches = 8;    // Default: 8 micro-batches per step and replica
  // Default: "auto" (cut by device speed and memory); "even"; or layer counts per stage, written
  // [3, 5] in TOML and kept here as "3,5".
  std::string partition = "auto";
  std::int64_t replicas = 1;  // Default: 1 pipeline; R > 1 = R data-parallel pipeline replicas
  std::string activation_checkpointing = "none";  // Default: "none"; or "stage" | "layer"
  // The format activations cross stages in: "compute" (the sending stage's precision; their
  // gradients come back in it too, but in fp32 from an fp16 stage) or "fp32". Default: "compute".
  std::string activations = "compute";
  // Default: "off" (the start cut stays); "adaptive": layers move between stages as the measured
  // speeds change (parallel/pipeline_recut.h, docs/pipeline.md). REQUIRES: a pipeline whose
  // partition is "auto" or "even" (the start cut), not listed layer counts.
  std::string recut = "off";
  std::int64_t recut_every = 20;  // Default: 20; re-plan the cut at least every N steps (>= 1)
  // Default: 0.05; the smallest predicted gain of a move, and the speed drift that re-plans
  // early, as a fraction (in (0, 1)).
  double recut_threshold = 0.05;
};

// Value type.
// ZeRO sharding over the data-parallel ranks (parallel/zero.h, docs/zero.md): rank r keeps the
// optimizer state (stage 1) and the reduced gradients (stage 2) of one contiguous slice of the
// flattened parameters, sized by `shards` independently of its batch share.
struct ZeroSection {
  // 0: replicated data parallelism; 1: optimizer state sharded; 2: gradients too (reduce-scatter
  // during backward). Stage 3 (parameters) is not built yet. Default: 0.
  std::int64_t stage = 0;
  // Whether the job writes zero.stage itself; when it does not, a plan (a plan file, plan =
  // "auto") decides the stage (jobUnderPlan, job_plan.h). Default: false.
  bool stage_given = false;
  // "memory": slices in proportion to what each rank's memory budget leaves after its replicated
  // state and activations (even when no rank has a budget); "even"; or "list" when the key
  // zero.shards is an array of per-rank fractions summing to 1 (then in `fractions`).
  // Default: "memory".
  std::string shards = "memory";
  std::vector<double> fractions;
  // 1: every rank also keeps its successor's slice (optimizer state and master copy) and steps
  // it, so that elastic recovery rebuilds a lost rank's slice from the replica instead of the
  // last checkpoint (docs/elastic.md); costs the replica's memory and, in stages 2 and 3, one
  // exchange of gradient slices per step. Needs zero.stage >= 1 and elastic.enabled. Default: 0.
  std::int64_t redundancy = 0;
};

// Elastic recovery (docs/elastic.md): when a worker is lost, the survivors agree on a new
// membership, take over its share of the global batch and redo the interrupted step, so the run
// continues on the trajectory of an uninterrupted one. Data parallelism without ZeRO only (other
// plans are refused). Value type.
struct ElasticSection {
  bool enabled = false;  // Default: false = a lost worker stops the job (chorus run exits 3)
  // Below this many devices the survivors write a checkpoint (with checkpoint.dir) and stop with
  // an error. Default: 1.
  std::int64_t min_devices = 1;
  // Each worker's heartbeat period, and how many missed beats make a worker lost (a hung or
  // stopped process, or a host cut off). Defaults: 1000 ms, 3.
  std::int64_t heartbeat_ms = 1000;
  std::int64_t heartbeat_misses = 3;
  // How many times each node's agent starts a replacement for one of its workers that failed;
  // the replacement joins the running job (docs/elastic.md). Default: 0 = never.
  std::int64_t max_restarts = 0;
};

struct JobConfig {
  std::vector<DeviceSpec> devices;  // top-level `devices`; Default: auto
  std::uint64_t seed = 1;           // Default: 1
  // Top-level `plan`: "manual" (Default: [parallel] and balancer.shares as written) or "auto"
  // (the planner sets them; writing one of them too is a ConfigError).
  std::string plan = "manual";
  // Top-level `cpu_threads`: intra-op threads of each CPU device at full speed
  // (device::intraOpThreads). Default: 0 = the cores the node's other workers leave idle, shared
  // among them (one each when there are none); emulated CPU devices always compute on one.
  std::int64_t cpu_threads = 0;
  TrainSection train;
  model::ModelConfig model;
  DataSection data;
  OptimizerSection optimizer;
  CommSection comm;
  BalancerSection balancer;
  PrecisionSection precision;
  CheckpointSection checkpoint;
  ParallelSection parallel;
  ZeroSection zero;
  ElasticSection elastic;
  std::string source;  // where it came from, for logs
  std::string toml;    // the whole configuration, canonical TOML (kept in checkpoints)
};

// The precision name of `rank` running on `device` ("fp32" | "bf16" | "fp16").
std::string precisionOf(const PrecisionSection& precision, int rank, const DeviceSpec& device);

// Reads and validates every key; rejects unknown keys. Throws ConfigError.
JobConfig readJobConfig(const Config& config);

// Checks the job against the devices it will run on, before any worker starts: the global batch
// gives every device a sample, the data files exist, and every memory budget holds the model's
// gradients and optimizer state plus one sample. Throws ConfigError.
void validateJobOnDevices(const JobConfig& job, const std::vector<DeviceSpec>& devices);

// Checks, before any worker starts, that checkpoint `dir` (resolveCheckpoint's answer) was written
// by this job: the same seed, global batch and model (the devices may differ). Throws
// CheckpointError "checkpoint '<dir>' is of another job: ..." naming what differs, as a worker
// resuming from it would, but before the job starts.
void validateResume(const JobConfig& job, const std::string& dir);

// The built-in default job: the Fashion-MNIST CNN on `devices = "auto"`, to a target accuracy.
const char* defaultJobToml();

}  // namespace chorus::runtime
