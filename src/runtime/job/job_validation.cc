// Checks of a job against its devices and files, run by `chorus train` before anything starts.
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_archive.h"
#include "chorus/core/error.h"
#include "chorus/model/model_config.h"
#include "chorus/runtime/checkpoint/checkpoint.h"
#include "chorus/runtime/job/job_config.h"
#include "chorus/runtime/job/memory_calibration.h"
#include "job/job_sections.h"
#include "job/trained_model.h"

namespace chorus::runtime {
namespace {

bool exists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0;
}

void checkDataFiles(const DataSection& data) {
  if (data.dataset == "fashion-mnist") {
    const std::string images = data.dir + "/train-images-idx3-ubyte";
    if (!exists(images + ".gz") && !exists(images))
      CHORUS_THROW(ConfigError, "config key 'data.dir': Fashion-MNIST not found at ", data.dir,
                   " (install the Debian package dataset-fashion-mnist; scripts/setup does)");
  } else if (data.dataset == "text" && !exists(data.path)) {
    CHORUS_THROW(ConfigError, "config key 'data.path': no text file at ", data.path,
                 " (scripts/setup extracts Moby Dick to /var/lib/chorus/data/mobydick.txt)");
  }
}

}  // namespace

void validateJobOnDevices(const JobConfig& job, const std::vector<DeviceSpec>& devices) {
  if (job.train.global_batch < static_cast<std::int64_t>(devices.size()))
    CHORUS_THROW(ConfigError, "config key 'train.global_batch': ", job.train.global_batch,
                 " is smaller than the number of devices (", devices.size(), ": ",
                 toString(devices), "); every device needs at least one sample per step");
  if (!job.balancer.shares.empty() && job.balancer.shares.size() != devices.size())
    CHORUS_THROW(ConfigError, "config key 'balancer.shares': ", job.balancer.shares.size(),
                 " shares for ", devices.size(), " devices");
  if (!job.balancer.initial_shares.empty() && job.balancer.initial_shares.size() != devices.size())
    CHORUS_THROW(ConfigError,
                 "config key 'balancer.initial_shares': ", job.balancer.initial_shares.size(),
                 " shares for ", devices.size(), " devices");
  // Entries past the last rank were ignored without a word; too few fail in the worker.
  if (!job.precision.ranks.empty() && job.precision.ranks.size() != devices.size())
    CHORUS_THROW(ConfigError, "config key 'precision.ranks': ", job.precision.ranks.size(),
                 " entries for ", devices.size(), " devices (", toString(devices), ")");
  checkDataFiles(job.data);
  const auto memory = memoryModelForBudgets(job, devices);
  const std::vector<double> shards = zeroShardFractions(job, devices, {}, memory);
  const int ranks = static_cast<int>(devices.size());
  for (int rank = 0; rank < ranks; ++rank) {
    const DeviceSpec& device = devices[rank];
    if (!device.memory_budget) continue;
    const plan::Dtype dtype = plan::parseDtype(precisionOf(job.precision, rank, device));
    plan::maxMicroBatch(*memory, dtype, *device.memory_budget, device.toString(),
                        static_cast<int>(job.zero.stage), ranks, shards.empty() ? 0 : shards[rank],
                        replicaFraction(job.zero, shards, rank, ranks));
  }
}

void validateResume(const JobConfig& job, const std::string& dir) {
  translateRestoreErrors(dir, [&] {
    const nlohmann::json saved =
        nlohmann::json::parse(readCheckpointFile(dir, readManifest(dir), "trainer.json"));
    auto mismatch = [&](const char* what, const std::string& then, const std::string& now) {
      CHORUS_THROW(CheckpointError, "checkpoint '", dir, "' is of another job: ", what, " was ",
                   then, ", the config says ", now);
    };
    const auto seed = saved.at("seed").get<std::uint64_t>();
    if (seed != job.seed) mismatch("seed", std::to_string(seed), std::to_string(job.seed));
    const auto batch = saved.at("global_batch").get<std::int64_t>();
    if (batch != job.train.global_batch)
      mismatch("train.global_batch", std::to_string(batch), std::to_string(job.train.global_batch));
    const std::string model = model::makeModel(trainedModelConfig(job), job.seed)->describe();
    if (saved.at("model").get<std::string>() != model)
      mismatch("the model", saved.at("model").get<std::string>(), model);
    // Another optimizer's state loads into libtorch's as an internal assertion, if at all.
    if (saved.contains("config")) {
      std::string name;
      try {
        name = Config::parseString(saved.at("config").get<std::string>(), "trainer.json config")
                   .getString("optimizer.name", OptimizerSection{}.name);
      } catch (const ConfigError& error) {
        CHORUS_THROW(CheckpointError, "checkpoint '", dir,
                     "': trainer.json holds a config this chorus cannot read: ", error.message());
      }
      if (name != job.optimizer.name) mismatch("optimizer.name", name, job.optimizer.name);
    }
  });
}

}  // namespace chorus::runtime
