// The job configuration: the built-in default, the examples, and at least ten bad configs that
// each get their own clear message before anything starts.
#include "chorus/runtime/job/job_config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

#include "chorus/core/error.h"
#include "chorus_version.h"

namespace chorus::runtime {
namespace {

JobConfig fromDefaultWith(const std::vector<std::string>& settings) {
  Config config = Config::parseString(defaultJobToml(), "<default>");
  for (const auto& setting : settings) config.set(setting);
  return readJobConfig(config);
}

std::string errorOf(const std::vector<std::string>& settings, const std::string& extra_toml = "") {
  try {
    Config config = Config::parseString(std::string(defaultJobToml()) + extra_toml, "job.toml");
    for (const auto& setting : settings) config.set(setting);
    const JobConfig job = readJobConfig(config);
    validateJobOnDevices(job, job.devices.front().kind == DeviceKind::kAuto
                                  ? parseDeviceSpecs("cpu,cpu")
                                  : job.devices);
  } catch (const ConfigError& error) {
    return error.message();
  }
  return "";
}

TEST(JobConfig, DefaultIsTheFashionMnistCnnOnAutoDevices) {
  const JobConfig job = fromDefaultWith({});
  EXPECT_EQ(job.model.kind, "cnn");
  EXPECT_EQ(job.data.dataset, "fashion-mnist");
  EXPECT_EQ(job.devices.size(), 1u);
  EXPECT_EQ(job.devices[0].kind, DeviceKind::kAuto);
  EXPECT_GT(job.train.target_accuracy, 0.0);
}

TEST(JobConfig, SetAddressesAnyKeyByItsDottedPath) {
  const JobConfig job = fromDefaultWith(
      {"devices=cpu@1.0,cpu@0.5", "balance=off", "train.global_batch=96", "optimizer.name=adamw"});
  ASSERT_EQ(job.devices.size(), 2u);
  EXPECT_EQ(job.devices[1].speed, 0.5);
  EXPECT_EQ(job.balancer.mode, "off");
  EXPECT_EQ(job.train.global_batch, 96);
  EXPECT_EQ(job.optimizer.name, "adamw");
}

// An initial loss scale the job sets holds on every device; one it leaves alone may start lower
// on a GPU older than Ampere (the trainer's choice), so the config says which it was.
TEST(JobConfig, AnInitialLossScaleRemembersWhetherTheJobSetIt) {
  const JobConfig plain = fromDefaultWith({});
  EXPECT_FALSE(plain.precision.loss_scale_cuda.init_given);
  EXPECT_EQ(plain.precision.loss_scale_cuda.init, 65536.0);
  const JobConfig common = fromDefaultWith({"precision.loss_scale.init=1024"});
  EXPECT_TRUE(common.precision.loss_scale_cuda.init_given);
  EXPECT_TRUE(common.precision.loss_scale_cpu.init_given);
  EXPECT_EQ(common.precision.loss_scale_cuda.init, 1024.0);
  const JobConfig cuda_only = fromDefaultWith({"precision.loss_scale.cuda.init=8192"});
  EXPECT_TRUE(cuda_only.precision.loss_scale_cuda.init_given);
  EXPECT_FALSE(cuda_only.precision.loss_scale_cpu.init_given);
}

// A key that nothing of this job reads is refused, naming what does read it; the built-in job
// leaves every kind's own keys at their defaults, so that --set switches the kind.
TEST(JobConfig, KeysOfAnotherModelOrOptimizerAreRefused) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"model.dropout=0.1"}, "'model.dropout': is read by model.kind gpt only"},
      {{"model.kind=mlp", "model.channels=16"}, "'model.channels': is read by model.kind cnn"},
      {{"model.hidden=[32]"}, "'model.hidden': is read by model.kind mlp only"},
      {{"model.kind=gpt", "model.classes=10"},
       "'model.classes': is read by model.kind mlp and cnn"},
      {{"model.layers=2"}, "'model.layers': is read by model.kind gpt only"},
      {{"optimizer.name=adamw", "optimizer.momentum=0.5"}, "'optimizer.momentum': is SGD's"},
      {{"optimizer.beta1=0.8"}, "'optimizer.beta1': is AdamW's"},
      {{"optimizer.beta2=0.99"}, "'optimizer.beta2': is AdamW's"},
      {{"optimizer.schedule=constant", "optimizer.min_lr_ratio=0.2"},
       "'optimizer.min_lr_ratio': is where the cosine schedule ends"},
  };
  for (const auto& [settings, expected] : cases)
    EXPECT_NE(errorOf(settings).find(expected), std::string::npos)
        << settings.back() << " gave: '" << errorOf(settings) << "'";
  // What each kind reads is accepted, from the built-in job too.
  EXPECT_EQ(fromDefaultWith(
                {"model.kind=gpt", "data.dataset=text", "model.dropout=0.1", "model.layers=2"})
                .model.layers,
            2);
  EXPECT_EQ(fromDefaultWith({"model.kind=mlp", "model.hidden=[32]"}).model.hidden.size(), 1u);
  EXPECT_EQ(fromDefaultWith({"optimizer.name=adamw", "optimizer.beta2=0.99"}).optimizer.beta2,
            0.99);
  EXPECT_EQ(fromDefaultWith({"optimizer.momentum=0.5"}).optimizer.momentum, 0.5);
  EXPECT_EQ(fromDefaultWith({}).model.channels, 32);
  EXPECT_EQ(fromDefaultWith({}).optimizer.momentum, 0.9);
}

TEST(JobConfig, ExampleDefaultEqualsTheBuiltInDefault) {
  std::ifstream file(std::string(CHORUS_SOURCE_DIR) + "/examples/default.toml");
  ASSERT_TRUE(file) << "examples/default.toml missing";
  std::stringstream text;
  text << file.rdbuf();
  EXPECT_EQ(Config::parseString(text.str()).toToml(),
            Config::parseString(defaultJobToml()).toToml());
}

TEST(JobConfig, ExamplesAreValid) {
  for (const char* name : {"default.toml", "hetero-emulated.toml", "gpt-text.toml"}) {
    const JobConfig job =
        readJobConfig(Config::parseFile(std::string(CHORUS_SOURCE_DIR) + "/examples/" + name));
    EXPECT_GE(job.train.steps, 1) << name;
  }
}

// Each bad config names what is wrong; the messages are all different.
TEST(JobConfig, BadConfigsGetTheirOwnClearMessages) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"optimzer.lr=0.1"}, "optimzer.lr"},   // unknown key (typo)
      {{"train.steps=many"}, "train.steps"},  // wrong type
      {{"train.steps=0"}, "train.steps"},     // impossible value
      {{"devices=cpu,cpu,cpu", "train.global_batch=2"}, "smaller than the number of devices"},
      {{"devices=gpu:0"}, "invalid device spec 'gpu:0'"},
      {{"balance=sometimes"}, "balance"},
      {{"optimizer.name=rmsprop"}, "optimizer.name"},
      {{"optimizer.lr=-1"}, "optimizer.lr"},
      {{"optimizer.momentum=1.5"}, "optimizer.momentum"},
      {{"model.kind=rnn"}, "model.kind"},
      {{"model.kind=gpt", "data.dataset=fashion-mnist"}, "data.dataset"},
      {{"model.kind=gpt", "model.width=100", "model.heads=3"}, "model.width"},
      {{"data.dataset=imagenet"}, "data.dataset"},
      {{"train.target_accuracy=2"}, "train.target_accuracy"},
      {{"comm.bucket_mb=0"}, "comm.bucket_mb"},
      {{"comm.first_bucket_mb=-1"}, "comm.first_bucket_mb"},
      {{"comm.min_buckets=0"}, "comm.min_buckets"},
      {{"comm.powersgd_iterations=0"}, "comm.powersgd_iterations"},
      {{"balancer.shares=[1,2]"}, "balancer.shares"},
      {{"balancer.initial_shares=[60,3]"}, "'balancer.initial_shares': must sum to"},
      {{"balancer.shares=[32,32]", "balancer.initial_shares=[32,32]"}, "cannot be combined"},
      {{"devices=cpu/1KiB"}, "cannot hold one training sample"},
      {{"data.dir=/nonexistent"}, "Fashion-MNIST not found"},
      {{"plan=sometimes"}, "config key 'plan'"},
      {{"plan=auto", "parallel.pipeline_stages=2"}, "'parallel.pipeline_stages': plan = \"auto\""},
  };
  std::set<std::string> messages;
  for (const auto& [settings, expected] : cases) {
    const std::string message = errorOf(settings);
    EXPECT_NE(message.find(expected), std::string::npos)
        << "settings " << settings.front() << " gave: '" << message << "'";
    messages.insert(message);
  }
  EXPECT_EQ(messages.size(), cases.size());
}

}  // namespace
}  // namespace chorus::runtime
