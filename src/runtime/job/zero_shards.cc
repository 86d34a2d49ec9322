// Each rank's fraction of ZeRO's sharded state for a job on its devices (job_sections.h): the
// job's list, even, or by memory through the job's calibrated memory model — around each rank's
// replica of its successor's slice where zero.redundancy keeps one.
#include <string>

#include "chorus/core/error.h"
#include "chorus/plan/device_catalog.h"
#include "chorus/plan/memory_model.h"
#include "chorus/plan/replica_shards.h"
#include "chorus/runtime/job/job_plan.h"
#include "chorus/runtime/job/memory_calibration.h"
#include "job/job_sections.h"

namespace chorus::runtime {
namespace {

std::vector<double> fractionsByMemory(const JobConfig& job, const std::vector<DeviceSpec>& devices,
                                      std::shared_ptr<const plan::MemoryModel> given) {
  const auto memory = given ? given : memoryModelForBudgets(job, devices);
  const int layers = memory->model().layerCount();
  const int ranks = static_cast<int>(devices.size());
  std::vector<plan::StageMemoryRequest> requests;
  std::vector<double> usable;
  std::vector<std::string> names;
  for (int r = 0; r < ranks; ++r) {
    const plan::Dtype dtype = plan::parseDtype(precisionOf(job.precision, r, devices[r]));
    requests.push_back(
        plan::zeroShardRequest(layers, dtype, static_cast<int>(job.zero.stage), ranks));
    // maxMicroBatch keeps a tenth of a budget spare.
    usable.push_back(0.9 * static_cast<double>(*devices[r].memory_budget));
    names.push_back(devices[r].toString());
  }
  if (job.zero.redundancy > 0 && ranks > 1)
    return plan::zeroShardsWithReplicas(*memory, requests, usable, names);
  return plan::zeroShardsByMemory(*memory, requests, usable, names);
}

}  // namespace

std::vector<double> zeroShardFractions(const JobConfig& job, const std::vector<DeviceSpec>& devices,
                                       const std::vector<double>& rates,
                                       std::shared_ptr<const plan::MemoryModel> memory) {
  const ZeroSection& zero = job.zero;
  if (zero.stage == 0 || zero.shards == "even") return {};
  if (zero.shards == "speed") {
    std::vector<double> fractions = startSpeeds(devices, rates);
    double total = 0;
    for (const double speed : fractions) total += speed;
    for (double& fraction : fractions) fraction /= total;
    return fractions;
  }
  if (zero.shards == "list") {
    require(zero.fractions.size() == devices.size(), "zero.shards",
            std::to_string(zero.fractions.size()) + " fractions for " +
                std::to_string(devices.size()) + " devices (" + toString(devices) + ")");
    return zero.fractions;
  }
  size_t budgets = 0;
  for (const DeviceSpec& device : devices) budgets += device.memory_budget ? 1 : 0;
  if (budgets == 0) return {};
  require(budgets == devices.size(), "zero.shards",
          "\"memory\" needs a memory budget on every device or on none (devices " +
              toString(devices) +
              "); give each one (e.g. cpu/2GiB), or set zero.shards = \"even\"");
  return fractionsByMemory(job, devices, std::move(memory));
}

double replicaFraction(const ZeroSection& zero, const std::vector<double>& shards, int rank,
                       int ranks) {
  if (zero.stage == 0 || zero.redundancy == 0 || ranks < 2) return 0;
  const int successor = (rank + 1) % ranks;
  return shards.empty() ? 1.0 / ranks : shards.at(successor);
}

}  // namespace chorus::runtime
