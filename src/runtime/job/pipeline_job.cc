// The plan of a pipeline job: the engine's options from the config, the replicas' shares, and
// the checks `chorus train` runs before any worker starts.
#include <algorithm>
#include <sstream>
#include <string>

#include "chorus/core/error.h"
#include "chorus/model/model_config.h"
#include "chorus/plan/balancer.h"
#include "chorus/runtime/job/memory_calibration.h"
#include "chorus/runtime/job/pipeline_job.h"

namespace chorus::runtime {
namespace {

// A replica's shares below the micro-batch count take samples, one at a time, from the largest
// share: the engine needs at least one sample per micro-batch.
void raiseToMicroBatches(std::vector<std::int64_t>& shares, std::int64_t micro_batches) {
  for (auto& share : shares) {
    while (share < micro_batches) {
      auto largest = std::max_element(shares.begin(), shares.end());
      CHORUS_CHECK_CONFIG(*largest > micro_batches, "pipeline: the global batch cannot give ",
                          shares.size(), " replicas ", micro_batches, " micro-batches each");
      --*largest;
      ++share;
    }
  }
}

}  // namespace

std::vector<std::vector<parallel::StageDevice>> stageDevices(
    const parallel::PipelineLayout& layout, const std::vector<DeviceSpec>& devices) {
  CHORUS_CHECK_CONFIG(static_cast<int>(devices.size()) == layout.worldSize(),
                      "pipeline: ", devices.size(), " devices for ", layout.worldSize(), " ranks");
  std::vector<std::vector<parallel::StageDevice>> grid(
      layout.replicas(), std::vector<parallel::StageDevice>(layout.stages()));
  for (int rank = 0; rank < layout.worldSize(); ++rank) {
    const parallel::StagePosition where = layout.positionOf(rank);
    grid[where.replica][where.stage] = {devices[rank].speed,
                                        devices[rank].memory_budget.value_or(0)};
  }
  return grid;
}

parallel::PipelineOptions pipelineOptions(const JobConfig& job) {
  const ParallelSection& section = job.parallel;
  parallel::PipelineOptions options;
  options.pipeline_stages = static_cast<int>(section.pipeline_stages);
  options.schedule = plan::parseSchedule(section.schedule);
  options.micro_batches = static_cast<int>(section.micro_batches);
  options.partition = section.partition;
  options.replicas = static_cast<int>(section.replicas);
  options.global_batch = job.train.global_batch;
  options.activation_checkpointing = plan::parseCheckpointing(section.activation_checkpointing);
  options.fp32_transfers = section.activations == "fp32";
  options.timeout = std::chrono::milliseconds(static_cast<long long>(job.comm.timeout_s * 1000));
  return options;
}

parallel::Checkpointing plannedCheckpointing(const plan::Plan& plan,
                                             parallel::Checkpointing job_mode) {
  if (!plan.replicas.at(0).stages.at(0).checkpoint) return parallel::Checkpointing::kNone;
  return job_mode == parallel::Checkpointing::kNone ? parallel::Checkpointing::kLayer : job_mode;
}

std::vector<std::int64_t> pipelineReplicaShares(
    const parallel::PipelineOptions& options, const std::vector<model::LayerProfile>& profile,
    const std::vector<int>& cuts, const std::vector<std::vector<parallel::StageDevice>>& devices) {
  CHORUS_CHECK_CONFIG(static_cast<int>(devices.size()) == options.replicas,
                      "pipeline shares: devices for ", devices.size(), " replicas, need ",
                      options.replicas);
  CHORUS_CHECK_CONFIG(static_cast<int>(cuts.size()) == options.pipeline_stages + 1,
                      "pipeline shares: ", cuts.size(), " cuts for ", options.pipeline_stages,
                      " stages");
  // Seconds per sample of each replica's slowest stage as the cut prices it (the plan's cost
  // model, parallel::stageSeconds), at the micro-batch of an equal split: the cost model's
  // per-layer overhead makes a sample's time depend on the micro-batch, and the balancer moves
  // the shares from here by measurement anyway.
  parallel::CutRequest request;
  request.profile = profile;
  request.options = options;
  const double micro = static_cast<double>(std::max<std::int64_t>(
      1, (options.global_batch / std::max(1, options.replicas) + options.micro_batches - 1) /
             std::max(1, options.micro_batches)));
  std::vector<double> rates;
  for (const auto& replica : devices) {
    double slowest = 0;
    for (int s = 0; s < options.pipeline_stages; ++s)
      slowest = std::max(slowest, parallel::stageSeconds(request, cuts[s], cuts[s + 1], micro) /
                                      replica.at(s).speed);
    rates.push_back(slowest > 0 ? micro / slowest : 1.0);
  }
  std::vector<std::int64_t> shares = plan::proportionalShares(options.global_batch, rates);
  raiseToMicroBatches(shares, options.micro_batches);
  return shares;
}

std::vector<std::int64_t> pipelineShareCaps(
    const parallel::PipelineOptions& options,
    const std::shared_ptr<const plan::MemoryModel>& memory, const std::vector<int>& cuts,
    const std::vector<std::vector<parallel::StageDevice>>& devices) {
  const int stages = options.pipeline_stages, micro_batches = options.micro_batches;
  std::vector<std::int64_t> caps;
  for (const auto& replica : devices) {
    std::int64_t largest = 0;  // largest micro-batch every budgeted stage holds; 0: no budget
    for (int s = 0; s < stages; ++s) {
      const std::uint64_t budget = replica.at(s).memory_bytes;
      if (budget == 0) continue;
      CHORUS_CHECK_CONFIG(memory, "pipeline share caps: a budget but no memory model");
      // No more than the whole batch, so that the product below cannot overflow.
      const std::int64_t fits = memory->largestMicroBatch(
          parallel::stageMemoryRequest(options, memory->model().layerCount(), s, cuts[s],
                                       cuts[s + 1], 0),
          static_cast<double>(budget), std::max<std::int64_t>(1, options.global_batch));
      // A stage that holds no micro-batch at all still gets one: the cut check passed with the
      // start shares, and a cap below the micro-batch count cannot be honoured.
      const std::int64_t stage_cap = std::max<std::int64_t>(1, fits);
      largest = largest == 0 ? stage_cap : std::min(largest, stage_cap);
    }
    caps.push_back(largest == 0 ? 0 : largest * micro_batches);
  }
  return caps;
}

void checkRecut(const JobConfig& job, const std::vector<DeviceSpec>& devices) {
  const bool budgets = std::any_of(devices.begin(), devices.end(), [](const DeviceSpec& device) {
    return device.memory_budget.has_value();
  });
  if (job.parallel.recut == "adaptive" && job.parallel.replicas > 1 && budgets &&
      job.balancer.mode != "off")
    CHORUS_THROW(ConfigError,
                 "config key 'parallel.recut': \"adaptive\" with memory budgets and "
                 "parallel.replicas > 1 needs balance = \"off\" (the balancer's share caps are "
                 "the start cut's)");
}

void validatePipelineJob(const JobConfig& job, const std::vector<DeviceSpec>& devices) {
  const parallel::PipelineOptions options = pipelineOptions(job);
  const parallel::PipelineLayout layout(options.replicas, options.pipeline_stages);
  if (static_cast<int>(devices.size()) != layout.worldSize())
    CHORUS_THROW(ConfigError, "config key 'devices': ", devices.size(),
                 " devices, but parallel.pipeline_stages (", layout.stages(),
                 ") x parallel.replicas (", layout.replicas(), ") needs exactly ",
                 layout.worldSize());
  checkRecut(job, devices);
  // A budget bounds one stage, not the whole model: the cut below checks budgets.
  std::vector<DeviceSpec> unbounded = devices;
  for (auto& device : unbounded) device.memory_budget.reset();
  validateJobOnDevices(job, unbounded);
  auto model = model::makeModel(job.model, job.seed);
  if (layout.stages() > model->numLayers())
    CHORUS_THROW(ConfigError, "config key 'parallel.pipeline_stages': ", layout.stages(),
                 " exceeds the model's ", model->numLayers(),
                 " layers (each stage needs one; model.hidden, model.blocks or model.layers "
                 "make more)");
  // Listed layer counts must cover the model (the count per stage is checked on reading).
  const std::string& partition = job.parallel.partition;
  if (partition != "auto" && partition != "even") {
    std::int64_t total = 0;
    std::istringstream counts(partition);
    for (std::string count; std::getline(counts, count, ',');) total += std::stoll(count);
    if (total != model->numLayers())
      CHORUS_THROW(ConfigError, "config key 'parallel.partition': pipeline partition '", partition,
                   "': need ", layout.stages(), " layer counts summing to the model's ",
                   model->numLayers(), " layers");
  }
  parallel::CutRequest request;
  request.profile = model->profile();
  request.options = options;
  request.devices = stageDevices(layout, devices);
  request.memory = memoryModelForBudgets(job, devices);
  try {
    parallel::stageCuts(request);
  } catch (const ConfigError& error) {
    CHORUS_THROW(ConfigError, "config section [parallel]: ", error.message());
  }
}

}  // namespace chorus::runtime
