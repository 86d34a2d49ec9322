// The [parallel] section: defaults, the example, and one clear message per bad value, all before
// anything starts.
#include <gtest/gtest.h>

#include "chorus/core/error.h"
#include "chorus/runtime/job/job_config.h"
#include "chorus/runtime/job/pipeline_job.h"
#include "chorus_version.h"
#include "runtime/job_fixtures.h"

namespace chorus::runtime {
namespace {

// A 2-stage GPT job on synthetic tokens; `settings` as --set would apply them.
const std::string kJob = testing::jobStart({.devices = "cpu@1.0,cpu@0.4"}, {.global_batch = 32}) +
                         testing::gptOnSynthetic({.size = std::nullopt}) + R"([parallel]
pipeline_stages = 2
)";

JobConfig jobWith(const std::vector<std::string>& settings) {
  Config config = Config::parseString(kJob, "job.toml");
  for (const auto& setting : settings) config.set(setting);
  return readJobConfig(config);
}

// The message of the ConfigError that reading (and checking against the job's devices) gives.
std::string errorOf(const std::vector<std::string>& settings) {
  try {
    const JobConfig job = jobWith(settings);
    if (job.parallel.pipeline_stages > 1) validatePipelineJob(job, job.devices);
  } catch (const ConfigError& error) {
    return error.message();
  }
  return "";
}

TEST(ParallelConfig, DefaultsArePlainDataParallelism) {
  const JobConfig job = readJobConfig(Config::parseString(defaultJobToml()));
  EXPECT_EQ(job.parallel.pipeline_stages, 1);
  EXPECT_EQ(job.parallel.schedule, "1f1b");
  EXPECT_EQ(job.parallel.micro_batches, 8);
  EXPECT_EQ(job.parallel.partition, "auto");
  EXPECT_EQ(job.parallel.replicas, 1);
  EXPECT_EQ(job.parallel.activation_checkpointing, "none");
}

TEST(ParallelConfig, ReadsEveryKeyAndMapsItOntoTheEngine) {
  const JobConfig job =
      jobWith({"devices=cpu,cpu,cpu,cpu", "parallel.replicas=2", "parallel.schedule=gpipe",
               "parallel.micro_batches=4", "parallel.partition=[3, 1]",
               "parallel.activation_checkpointing=layer", "comm.timeout_s=7"});
  EXPECT_EQ(job.parallel.partition, "3,1");
  const parallel::PipelineOptions options = pipelineOptions(job);
  EXPECT_EQ(options.pipeline_stages, 2);
  EXPECT_EQ(options.replicas, 2);
  EXPECT_EQ(options.schedule, parallel::Schedule::kGpipe);
  EXPECT_EQ(options.micro_batches, 4);
  EXPECT_EQ(options.partition, "3,1");
  EXPECT_EQ(options.activation_checkpointing, parallel::Checkpointing::kLayer);
  EXPECT_EQ(options.global_batch, 32);
  EXPECT_EQ(options.timeout.count(), 7000);
  EXPECT_EQ(errorOf({"devices=cpu,cpu,cpu,cpu", "parallel.replicas=2", "parallel.partition=3,1"}),
            "");
}

TEST(ParallelConfig, ThePipelineExampleIsValid) {
  const JobConfig job = readJobConfig(
      Config::parseFile(std::string(CHORUS_SOURCE_DIR) + "/examples/gpt-pipeline.toml"));
  EXPECT_EQ(job.parallel.pipeline_stages, 2);
  EXPECT_EQ(job.parallel.schedule, "1f1b");
  EXPECT_EQ(job.parallel.partition, "auto");
  EXPECT_EQ(toString(job.devices), "cpu,cpu@0.4");
}

struct BadCase {
  std::vector<std::string> settings;
  std::string message;  // a part of the expected message
};

TEST(ParallelConfig, EachBadValueGetsItsOwnMessage) {
  const std::vector<BadCase> cases = {
      {{"parallel.pipeline_stages=0"}, "config key 'parallel.pipeline_stages': must be at least 1"},
      {{"parallel.schedule=zigzag"},
       "config key 'parallel.schedule': 'zigzag' is unknown; expected 1f1b, gpipe"},
      {{"parallel.micro_batches=0"}, "config key 'parallel.micro_batches': must be at least 1"},
      {{"parallel.replicas=0"}, "config key 'parallel.replicas': must be at least 1"},
      {{"parallel.activation_checkpointing=all"},
       "config key 'parallel.activation_checkpointing': 'all' is unknown; expected none, stage, "
       "layer"},
      {{"parallel.partition=uneven"},
       "config key 'parallel.partition': 'uneven': expected \"auto\", \"even\" or positive layer "
       "counts like [3, 5]"},
      {{"parallel.partition=[3, 0]"}, "'3,0': expected \"auto\""},
      {{"parallel.partition=[4]"},
       "config key 'parallel.partition': 1 layer counts for 2 pipeline"},
      {{"parallel.partition=[1, 1]"},
       "pipeline partition '1,1': need 2 layer counts summing to the model's 4 layers"},
      {{"devices=cpu,cpu,cpu"},
       "config key 'devices': 3 devices, but parallel.pipeline_stages (2) x parallel.replicas (1) "
       "needs exactly 2"},
      {{"parallel.replicas=2"}, "x parallel.replicas (2) needs exactly 4"},
      {{"parallel.micro_batches=40"},
       "config key 'train.global_batch': 32 cannot give each of 1 pipeline replicas its 40 "
       "micro-batches"},
      {{"parallel.pipeline_stages=1", "parallel.replicas=2"},
       "config key 'parallel.replicas': needs parallel.pipeline_stages > 1"},
      {{"parallel.pipeline_stages=5", "devices=cpu,cpu,cpu,cpu,cpu"},
       "exceeds the model's 4 layers"},
      {{"train.micro_batch=4"}, "config key 'train.micro_batch': is not supported with"},
      {{"comm.compression=int8"},
       "config key 'comm.compression': needs parallel.replicas > 1 in a pipeline"},
      {{"comm.algorithm=hierarchical"}, "config key 'comm.algorithm': is not supported with"},
      {{"devices=cpu,cpu/4KiB"}, "fits the devices' memory"},
  };
  for (const BadCase& bad : cases) {
    const std::string message = errorOf(bad.settings);
    EXPECT_NE(message.find(bad.message), std::string::npos)
        << bad.settings.front() << " gave: '" << message << "'";
  }
}

TEST(ParallelConfig, AnUnknownKeyIsRejectedWithASuggestion) {
  const std::string message = errorOf({"parallel.micro_batch=2"});
  EXPECT_NE(message.find("parallel.micro_batch"), std::string::npos) << message;
  EXPECT_NE(message.find("did you mean 'parallel.micro_batches'"), std::string::npos) << message;
}

}  // namespace
}  // namespace chorus::runtime
