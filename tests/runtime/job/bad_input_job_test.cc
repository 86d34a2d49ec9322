// Bad-input table, job files (JOB- rows of docs/errors.md): TOML that `chorus train` refuses
// before any worker starts — syntax, unknown keys, types, ranges, and combinations that would
// not do what they say.
#include <gtest/gtest.h>

#include "bad_input_table.h"
#include "chorus/core/config.h"
#include "chorus/runtime/job/job_config.h"
#include "chorus/runtime/job/pipeline_job.h"
#include "runtime/job_fixtures.h"

namespace chorus::runtime {
namespace {

using chorus::testing::BadInputRow;

// A small valid job; each row adds TOML after it (new tables or top-level keys only) or --set
// assignments.
const std::string kBaseJob =
    testing::jobStart({.devices = "cpu,cpu"}, {.steps = 10, .global_batch = 16}) +
    testing::mlpOnSynthetic({.hidden = "[16]", .size = 256});

// The same for a GPT: the MLP's keys would be refused by it.
const std::string kGptJob =
    testing::jobStart({.devices = "cpu,cpu"}, {.steps = 10, .global_batch = 16}) +
    R"([model]
kind = "gpt"
)" + testing::syntheticData(256);

// The two without data.size, which only synthetic data reads: rows that switch data.dataset.
const std::string kBaseJobOfAnyData =
    testing::jobStart({.devices = "cpu,cpu"}, {.steps = 10, .global_batch = 16}) +
    testing::mlpOnSynthetic({.hidden = "[16]"});
const std::string kGptJobOfAnyData =
    testing::jobStart({.devices = "cpu,cpu"}, {.steps = 10, .global_batch = 16}) +
    "[model]\nkind = \"gpt\"\n" + testing::syntheticData();

struct JobRow {
  BadInputRow row;
  std::vector<std::string> settings = {};  // --set assignments
  std::string toml = "";                   // appended to kBaseJob
  std::string base = kBaseJob;
};

// gtest prints a failing row by its id.
void PrintTo(const JobRow& param, std::ostream* out) { *out << param.row.id; }

// What `chorus train` checks before it starts workers (tools/chorus/train_command.cc), with the
// job's own devices standing in for this host's.
void readAndValidate(const JobRow& param) {
  Config config = Config::parseString(param.base + param.toml, "job.toml");
  for (const std::string& setting : param.settings) config.set(setting);
  const JobConfig job = readJobConfig(config);
  if (job.parallel.pipeline_stages > 1)
    validatePipelineJob(job, job.devices);
  else
    validateJobOnDevices(job, job.devices);
}

const std::vector<JobRow>& jobRows() {
  static const std::vector<JobRow> rows = {
      {{"JOB-01", "ConfigError",
        "job.toml:13:13: Error while parsing key-value pair: expected value"},
       {},
       "[comm]\ntimeout_s = \n"},
      {{"JOB-02", "ConfigError",
        "unknown config key: 'optimizer.momentun' (job.toml line 13; did you mean "
        "'optimizer.momentum'?)"},
       {},
       "[optimizer]\nmomentun = 0.5\n"},
      {{"JOB-03", "ConfigError",
        "config key 'train.steps' (--set): expected an integer, got a "
        "string"},
       {"train.steps=\"ten\""}},
      {{"JOB-04", "ConfigError",
        "config key 'train.global_batch' (--set): expected an integer, got a float"},
       {"train.global_batch=16.5"}},
      {{"JOB-05", "ConfigError",
        "config key 'devices' (job.toml line 1): expected a string, got "
        "an array"},
       {},
       "",
       "devices = [\"cpu\", \"cpu\"]\n"},
      {{"JOB-06", "ConfigError",
        "config key 'optimizer.lr' (job.toml line 13): expected a finite number, got nan"},
       {},
       "[optimizer]\nlr = nan\n"},
      {{"JOB-07", "ConfigError",
        "config key 'comm.timeout_s' (job.toml line 13): expected a finite number, got inf"},
       {},
       "[comm]\ntimeout_s = inf\n"},
      {{"JOB-08", "ConfigError",
        "config key 'comm.timeout_s': must be in [0.001, 604800] seconds (1 ms to a week)"},
       {"comm.timeout_s=1e7"}},
      {{"JOB-09", "ConfigError", "'99999999999999999999' is not representable in 64 bits"},
       {},
       "seed = 99999999999999999999\n"},
      {{"JOB-10", "ConfigError", "config key 'optimizer.lr': must be positive"},
       {"optimizer.lr=-1"}},
      {{"JOB-11", "ConfigError", "config key 'train.target_accuracy': must be in [0, 1]"},
       {"train.target_accuracy=2"}},
      {{"JOB-12", "ConfigError", "config key 'seed': must be >= 0"}, {"seed=-1"}},
      {{"JOB-13", "ConfigError",
        "config key 'balance': 'fast' is unknown; expected off, static or adaptive"},
       {"balance=fast"}},
      {{"JOB-14", "ConfigError", "model.kind \"rnn\" is unknown; known kinds: mlp, cnn, gpt"},
       {"model.kind=rnn"}},
      {{"JOB-15", "ConfigError", "config key 'comm.compression': 'zstd' is unknown"},
       {"comm.compression=zstd"}},
      {{"JOB-16", "ConfigError",
        "config key 'precision.default': 'fp8' is unknown; expected fp32, bf16 or fp16"},
       {"precision.default=fp8"}},
      {{"JOB-17", "ConfigError", "config key 'data.dataset': 'text' does not fit model.kind 'mlp'"},
       {"data.dataset=text"}},
      {{"JOB-18", "ConfigError", "model.width (100) must be divisible by model.heads (3)"},
       {"model.kind=gpt", "model.width=100", "model.heads=3"}},
      {{"JOB-19", "ConfigError",
        "config key 'balancer.shares': must sum to train.global_batch (16), not 20"},
       {"balancer.shares=[10, 10]"}},
      {{"JOB-20", "ConfigError",
        "config key 'balancer.initial_shares': cannot be combined with balancer.shares"},
       {"balancer.shares=[8, 8]", "balancer.initial_shares=[8, 8]"}},
      {{"JOB-21", "ConfigError", "config key 'checkpoint.every': needs checkpoint.dir"},
       {"checkpoint.every=5"}},
      {{"JOB-22", "ConfigError", "config key 'checkpoint.async': needs checkpoint.dir"},
       {"checkpoint.async=true"}},
      {{"JOB-23", "ConfigError",
        "config key 'parallel.pipeline_stages': plan = \"auto\" chooses it"},
       {"plan=auto", "parallel.pipeline_stages=2"}},
      {{"JOB-24", "ConfigError",
        "config key 'parallel.replicas': needs parallel.pipeline_stages > 1"},
       {"parallel.replicas=2"}},
      {{"JOB-25", "ConfigError",
        "config key 'parallel.activation_checkpointing': needs parallel.pipeline_stages > 1"},
       {"parallel.activation_checkpointing=layer"}},
      {{"JOB-26", "ConfigError",
        "config key 'parallel.micro_batches': needs parallel.pipeline_stages > 1"},
       {"parallel.micro_batches=4"}},
      {{"JOB-27", "ConfigError",
        "config key 'comm.compression': needs parallel.replicas > 1 in a pipeline"},
       {"parallel.pipeline_stages=2", "comm.compression=fp16"}},
      {{"JOB-28", "ConfigError",
        "config key 'parallel.partition': 1 layer counts for 2 pipeline stages"},
       {"parallel.pipeline_stages=2", "parallel.partition=[3]"}},
      {{"JOB-29", "ConfigError",
        "config key 'model.classes': 5 does not fit Fashion-MNIST, which has 10 classes"},
       {"data.dataset=fashion-mnist", "model.classes=5"}},
      {{"JOB-30", "ConfigError", "config key 'model.vocab': is taken from the corpus"},
       {"data.dataset=text", "model.vocab=50"},
       "",
       kGptJob},
      {{"JOB-31", "ConfigError",
        "config key 'train.global_batch': 1000 is larger than the synthetic data set (data.size "
        "= 256)"},
       {"train.global_batch=1000"}},
      {{"JOB-32", "ConfigError",
        "config key 'train.global_batch': 1 is smaller than the number of devices (2: cpu,cpu)"},
       {"train.global_batch=1"}},
      {{"JOB-33", "ConfigError", "config key 'precision.ranks': 3 entries for 2 devices (cpu,cpu)"},
       {"precision.ranks=[\"fp32\", \"bf16\", \"fp32\"]"}},
      {{"JOB-34", "ConfigError",
        "device 'cpu/1K': the memory budget of 1 KiB cannot hold one training sample"},
       {"devices=cpu/1KiB"}},
      {{"JOB-35", "ConfigError", "Fashion-MNIST not found at /nonexistent"},
       {"data.dataset=fashion-mnist", "model.input_shape=[1, 28, 28]", "data.dir=/nonexistent"},
       "",
       kBaseJobOfAnyData},
      {{"JOB-36", "ConfigError", "config key 'data.path': no text file at /nonexistent.txt"},
       {"data.dataset=text", "data.path=/nonexistent.txt"},
       "",
       kGptJobOfAnyData},
      {{"JOB-37", "ConfigError",
        "invalid --set 'train.steps.x=1': 'train.steps' is an integer, not a table"},
       {"train.steps.x=1"}},
      {{"JOB-38", "ConfigError", "config key 'precision.loss_scale.backoff': must be in (0, 1)"},
       {"precision.loss_scale.backoff=1.5"}},
      {{"JOB-39", "ConfigError",
        "config key 'comm.compression': cannot be combined with comm.sync_every > 1"},
       {"comm.sync_every=4", "comm.compression=fp16"}},
      {{"JOB-40", "ConfigError",
        "config key 'comm.algorithm': cannot be combined with comm.sync_every > 1"},
       {"comm.sync_every=4", "comm.algorithm=hierarchical"}},
      {{"JOB-41", "ConfigError", "config key 'comm.algorithm': '2d' cannot carry a codec"},
       {"comm.algorithm=2d", "comm.compression=int8"}},
      {{"JOB-42", "ConfigError", "config key 'zero.stage': must be 0, 1, 2 or 3"},
       {"zero.stage=4"}},
      {{"JOB-43", "ConfigError", "config key 'zero.shards': the fractions sum to 1.1"},
       {"zero.stage=1", "zero.shards=[0.5,0.6]"}},
      {{"JOB-44", "ConfigError",
        "config key 'parallel.pipeline_stages': cannot be combined with zero.stage = 1"},
       {"zero.stage=1", "parallel.pipeline_stages=2"}},
      {{"JOB-45", "ConfigError",
        "config key 'zero.shards': \"memory\" needs a memory budget on every device or on none"},
       {"zero.stage=2", "devices=cpu/64MiB,cpu"}},
      {{"JOB-46", "ConfigError",
        "ZeRO shards by memory: device 'cpu/1K' (rank 0) cannot hold even its unsharded part"},
       {"zero.stage=2", "devices=cpu/1KiB,cpu/64MiB"}},
      {{"JOB-47", "ConfigError",
        "config key 'comm.compression': cannot be combined with zero.stage = 2"},
       {"zero.stage=2", "comm.compression=int8"}},
      {{"JOB-48", "ConfigError", "config key 'zero.shards': needs zero.stage >= 1"},
       {"zero.shards=even"}},
      {{"JOB-49", "ConfigError", "config key 'elastic.min_devices': needs elastic.enabled = true"},
       {"elastic.min_devices=2"}},
      {{"JOB-50", "ConfigError", "config key 'elastic.heartbeat_ms': must be at least 50"},
       {"elastic.enabled=true", "elastic.heartbeat_ms=10"}},
      {{"JOB-51", "ConfigError",
        "config key 'zero.stage': with elastic.enabled = true needs checkpoint.dir"},
       {"elastic.enabled=true", "zero.stage=1"}},
      {{"JOB-52", "ConfigError",
        "config key 'parallel.pipeline_stages': with elastic.enabled = true needs checkpoint.dir"},
       {"elastic.enabled=true", "parallel.pipeline_stages=2"}},
      {{"JOB-53", "ConfigError",
        "config key 'elastic.min_devices': 3 is more than the job's 2 devices"},
       {"elastic.enabled=true", "elastic.min_devices=3"}},
      {{"JOB-54", "ConfigError", "config key 'elastic.max_restarts': must be at least 0"},
       {"elastic.enabled=true", "elastic.max_restarts=-1"}},
      {{"JOB-55", "ConfigError", "config key 'elastic.max_restarts': needs elastic.enabled = true"},
       {"elastic.max_restarts=1"}},
      {{"JOB-56", "ConfigError", "config key 'parallel.recut': needs parallel.pipeline_stages > 1"},
       {"parallel.recut=adaptive"}},
      {{"JOB-57", "ConfigError",
        "config key 'parallel.recut': \"adaptive\" moves the cut, but parallel.partition lists "
        "it"},
       {"parallel.pipeline_stages=2", "parallel.partition=[1, 2]", "parallel.recut=adaptive"}},
      {{"JOB-58", "ConfigError",
        "config key 'parallel.recut': 'sometimes' is unknown; expected off, adaptive"},
       {"parallel.pipeline_stages=2", "parallel.recut=sometimes"}},
      {{"JOB-59", "ConfigError", "config key 'parallel.recut_threshold': must be in (0, 1)"},
       {"parallel.pipeline_stages=2", "parallel.recut=adaptive", "parallel.recut_threshold=1.5"}},
      {{"JOB-60", "ConfigError",
        "config key 'parallel.recut_every': needs parallel.recut = \"adaptive\""},
       {"parallel.pipeline_stages=2", "parallel.recut_every=10"}},
      {{"JOB-61", "ConfigError",
        "config key 'parallel.recut': \"adaptive\" with memory budgets and parallel.replicas > 1 "
        "needs balance = \"off\""},
       {"parallel.pipeline_stages=2", "parallel.replicas=2", "parallel.recut=adaptive",
        "balance=adaptive", "devices=cpu/64MiB,cpu,cpu,cpu"}},
      {{"JOB-62", "ConfigError",
        "config key 'parallel.activations': needs parallel.pipeline_stages > 1"},
       {"parallel.activations=fp32"}},
      {{"JOB-63", "ConfigError",
        "config key 'parallel.activations': 'fp8' is unknown; expected compute, fp32"},
       {"parallel.pipeline_stages=2", "parallel.activations=fp8"}},
      {{"JOB-64", "ConfigError", "config key 'zero.redundancy': must be 0 or 1"},
       {"zero.stage=1", "zero.redundancy=2"}},
      {{"JOB-65", "ConfigError",
        "config key 'zero.redundancy': needs zero.stage >= 1 (stage 0 replicates everything)"},
       {"zero.redundancy=1"}},
      {{"JOB-66", "ConfigError",
        "config key 'zero.redundancy': needs elastic.enabled = true (the replicas serve only "
        "elastic recovery)"},
       {"zero.stage=2", "zero.redundancy=1"}},
      {{"JOB-67", "ConfigError",
        "config key 'model.dropout': is read by model.kind gpt only, and this job's is 'mlp'; "
        "remove the key"},
       {"model.dropout=0.1"}},
      {{"JOB-68", "ConfigError",
        "config key 'optimizer.beta1': is AdamW's; SGD's is optimizer.momentum; remove the key"},
       {"optimizer.beta1=0.8"}},
      {{"JOB-69", "ConfigError",
        "config key 'optimizer.momentum': is SGD's; AdamW's moments are optimizer.beta1 and "
        "beta2; remove the key"},
       {"optimizer.name=adamw", "optimizer.momentum=0.5"}},
      {{"JOB-70", "ConfigError",
        "config key 'optimizer.min_lr_ratio': is where the cosine schedule ends; "
        "optimizer.schedule is 'constant'; remove the key"},
       {"optimizer.schedule=constant", "optimizer.min_lr_ratio=0.2"}},
      {{"JOB-71", "ConfigError",
        "config key 'cpu_threads': must be >= 0 (0 = the node's spare cores)"},
       {"cpu_threads=-2"}},
      {{"JOB-72", "ConfigError",
        "config key 'data.path': is read by data.dataset text only, and this job's is "
        "'synthetic'; remove the key"},
       {"data.path=/tmp/corpus.txt"}},
      {{"JOB-73", "ConfigError",
        "config key 'comm.powersgd_rank': is read by comm.compression = powersgd only, and this "
        "job's is 'int8'; remove the key"},
       {"comm.compression=int8", "comm.powersgd_rank=2"}},
      {{"JOB-74", "ConfigError", "config key 'checkpoint.at_end': needs checkpoint.dir"},
       {"checkpoint.at_end=false"}},
      {{"JOB-75", "ConfigError",
        "config key 'balancer.leave_out': is not supported with parallel.pipeline_stages > 1"},
       {"parallel.pipeline_stages=2", "balancer.leave_out=false"}},
      {{"JOB-76", "ConfigError",
        "config key 'comm.bucket_mb': needs parallel.replicas > 1 in a pipeline"},
       {"parallel.pipeline_stages=2", "comm.bucket_mb=5"}},
  };
  return rows;
}

class JobBadInput : public ::testing::TestWithParam<JobRow> {};

TEST_P(JobBadInput, IsRefusedBeforeAnyWorkerStarts) {
  const JobRow& param = GetParam();
  try {
    readAndValidate(param);
    ADD_FAILURE() << param.row.id << ": the job was accepted";
  } catch (const Error& error) {
    EXPECT_TRUE(chorus::testing::matchesRow(error, param.row));
  }
}

INSTANTIATE_TEST_SUITE_P(Rows, JobBadInput, ::testing::ValuesIn(jobRows()),
                         chorus::testing::rowName<JobRow>);

TEST(JobBadInputTable, RowsMatchDocsErrorsMd) {
  chorus::testing::expectRowsDocumented("JOB-", chorus::testing::rowsOf(jobRows()));
}

// The base job itself is fine, so each row fails for its own reason.
TEST(JobBadInputTable, BaseJobIsAccepted) { EXPECT_NO_THROW(readAndValidate({})); }

}  // namespace
}  // namespace chorus::runtime
