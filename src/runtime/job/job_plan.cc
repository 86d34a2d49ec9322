#include "chorus/runtime/job/job_plan.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>

#include "chorus/core/error.h"
#include "chorus/model/model_config.h"
#include "chorus/parallel/pipeline_layout.h"
#include "chorus/runtime/job/memory_calibration.h"
#include "chorus/runtime/job/pipeline_job.h"
#include "job/balancer_settings.h"
#include "job/job_sections.h"
#include "job/trained_model.h"

namespace chorus::runtime {
namespace {

template <typename T>
std::string joined(const std::vector<T>& items, const char* separator) {
  std::ostringstream text;
  for (size_t i = 0; i < items.size(); ++i) text << (i ? separator : "") << items[i];
  return text.str();
}

std::vector<model::LayerProfile> layerProfile(const JobConfig& job) {
  return model::makeModel(trainedModelConfig(job), job.seed)->profile();
}

int layerCount(const JobConfig& job) { return static_cast<int>(layerProfile(job).size()); }

std::vector<plan::RankPlan> rankPlans(const JobConfig& job, const std::vector<DeviceSpec>& devices,
                                      const std::vector<std::string>& nodes) {
  std::vector<plan::RankPlan> ranks;
  for (size_t r = 0; r < devices.size(); ++r) {
    plan::RankPlan rank;
    rank.device = static_cast<int>(r);
    rank.device_type = devices[r].toString();
    rank.spec = devices[r];
    rank.node = nodes.empty() ? "node0" : nodes.at(r);
    rank.precision = plan::parseDtype(precisionOf(job.precision, static_cast<int>(r), devices[r]));
    // The type is the device's spec, emulated speed and budget included (as in a local cluster
    // file, plan/local_cluster.h): nothing is emulated on top of it.
    ranks.push_back(rank);
  }
  return ranks;
}

// Where the balancer starts: fixed shares, the initial ones, its equal split under `balance =
// "off"` (DDP's), else shares in proportion to the devices' expected speeds (startSpeeds), each
// device at least one sample when the batch allows, so that every device is measured before the
// balancer judges it. Why not the equal split: a GPU beside a CPU at 256/256 made the first steps
// of a job take seconds each (the CPU's half of the batch).
std::vector<std::int64_t> startShares(const JobConfig& job, const std::vector<double>& speeds) {
  const int ranks = static_cast<int>(speeds.size());
  CHORUS_CHECK_CONFIG(
      job.balancer.shares.empty() || job.balancer.shares.size() == static_cast<size_t>(ranks),
      "config key 'balancer.shares': ", job.balancer.shares.size(), " shares for ", ranks,
      " ranks");
  if (!job.balancer.shares.empty()) return job.balancer.shares;
  const plan::BalancerOptions options = balancerOptions(job.balancer);
  if (!options.initial_shares.empty() || options.mode == plan::BalancerMode::kOff)
    return plan::LoadBalancer(options, ranks, job.train.global_batch, {}).shares();
  std::vector<std::int64_t> shares = plan::proportionalShares(job.train.global_batch, speeds);
  if (job.train.global_batch < ranks) return shares;
  for (std::int64_t& share : shares) {
    if (share > 0) continue;
    *std::max_element(shares.begin(), shares.end()) -= 1;
    share = 1;
  }
  return shares;
}

void planDataParallel(plan::Plan& plan, const JobConfig& job, int layers,
                      const std::vector<double>& speeds) {
  const auto shares = startShares(job, speeds);
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    plan::ReplicaPlan replica;
    replica.share = static_cast<int>(shares[r]);
    plan::StagePlan stage;
    stage.last_layer = layers;
    stage.rank = static_cast<int>(r);
    const std::int64_t micro = job.train.micro_batch;
    stage.micro_batch =
        static_cast<int>(micro > 0 ? std::min<std::int64_t>(micro, shares[r]) : shares[r]);
    replica.stages.push_back(stage);
    plan.replicas.push_back(replica);
  }
}

void planPipeline(plan::Plan& plan, const JobConfig& job, const std::vector<DeviceSpec>& devices,
                  std::shared_ptr<const plan::MemoryModel> memory) {
  const parallel::PipelineOptions options = pipelineOptions(job);
  const parallel::PipelineLayout layout(options.replicas, options.pipeline_stages);
  CHORUS_CHECK_CONFIG(static_cast<int>(devices.size()) == layout.worldSize(),
                      "config key 'devices': ", devices.size(), " devices (", toString(devices),
                      "), but parallel.pipeline_stages (", layout.stages(),
                      ") x parallel.replicas (", layout.replicas(), ") needs exactly ",
                      layout.worldSize());
  parallel::CutRequest request;
  request.profile = layerProfile(job);
  request.options = options;
  request.devices = stageDevices(layout, devices);
  request.memory = std::move(memory);
  const std::vector<int> cuts = parallel::stageCuts(request);
  const std::vector<std::int64_t> shares =
      pipelineReplicaShares(options, request.profile, cuts, request.devices);
  plan.micro_batches = options.micro_batches;
  plan.schedule = options.schedule;
  for (int r = 0; r < layout.replicas(); ++r) {
    plan::ReplicaPlan replica;
    replica.share = static_cast<int>(shares[r]);
    for (int s = 0; s < layout.stages(); ++s) {
      plan::StagePlan stage;
      stage.first_layer = cuts[s];
      stage.last_layer = cuts[s + 1];
      stage.rank = r * layout.stages() + s;
      stage.micro_batch = (replica.share + plan.micro_batches - 1) / plan.micro_batches;
      stage.checkpoint = options.activation_checkpointing != parallel::Checkpointing::kNone;
      replica.stages.push_back(stage);
    }
    plan.replicas.push_back(replica);
  }
}

}  // namespace

std::vector<double> startSpeeds(const std::vector<DeviceSpec>& devices,
                                const std::vector<double>& rates) {
  CHORUS_CHECK_CONFIG(rates.empty() || rates.size() == devices.size(), "plan: ", rates.size(),
                      " device rates for ", devices.size(), " devices");
  std::vector<double> speeds;
  for (size_t r = 0; r < devices.size(); ++r) {
    const double rate = rates.empty() ? 1.0 : rates[r];
    CHORUS_CHECK_CONFIG(std::isfinite(rate) && rate > 0, "plan: device ", devices[r].toString(),
                        " has a rate of ", rate);
    speeds.push_back(rate * devices[r].speed);
  }
  return speeds;
}

plan::Plan planOfJob(const JobConfig& job, const std::vector<DeviceSpec>& devices,
                     const std::vector<std::string>& nodes, const std::vector<double>& rates) {
  CHORUS_CHECK_CONFIG(!devices.empty(), "plan: a job without devices");
  CHORUS_CHECK_CONFIG(nodes.empty() || nodes.size() == devices.size(), "plan: ", nodes.size(),
                      " node names for ", devices.size(), " devices");
  plan::Plan plan;
  plan.model = job.model.kind;
  plan.global_batch = static_cast<int>(job.train.global_batch);
  plan.seed = job.seed;
  plan.ranks = rankPlans(job, devices, nodes);
  plan.comm = commOf(job);
  // Measured once (null without budgets): the cut, ZeRO's slices and the workers size by it.
  const auto memory = memoryModelForBudgets(job, devices);
  if (job.parallel.pipeline_stages > 1)
    planPipeline(plan, job, devices, memory);
  else
    planDataParallel(plan, job, layerCount(job), startSpeeds(devices, rates));
  plan.zero_stage = static_cast<int>(job.zero.stage);
  plan.zero_shards = zeroShardFractions(job, devices, rates, memory);
  plan.reason = "as the job's [parallel] and balancer keys say";
  if (memory) plan.memory_profile = memory->model();
  return plan;
}

plan::Plan inRankOrder(const plan::Plan& plan) {
  plan::Plan ordered = plan;
  ordered.ranks.clear();
  for (auto& replica : ordered.replicas) {
    for (auto& stage : replica.stages) {
      CHORUS_CHECK_CONFIG(stage.rank >= 0 && stage.rank < static_cast<int>(plan.ranks.size()),
                          "plan: a stage names rank ", stage.rank, " of ", plan.ranks.size());
      ordered.ranks.push_back(plan.ranks[stage.rank]);
      stage.rank = static_cast<int>(ordered.ranks.size()) - 1;
    }
  }
  CHORUS_CHECK_CONFIG(ordered.ranks.size() == plan.ranks.size(), "plan: ", plan.ranks.size(),
                      " ranks, but its stages use ", ordered.ranks.size());
  return ordered;
}

std::vector<DeviceSpec> devicesOfPlan(const plan::Plan& plan,
                                      const std::vector<DeviceSpec>& devices) {
  std::vector<DeviceSpec> ordered;
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    const plan::RankPlan& rank = plan.ranks[r];
    CHORUS_CHECK_CONFIG(rank.device >= 0 && rank.device < static_cast<int>(devices.size()),
                        "plan: rank ", r, " runs on device ", rank.device, ", but the job has ",
                        devices.size(), " devices (", toString(devices), ")");
    const DeviceSpec& device = devices[rank.device];
    // A plan made for a job's devices names them; a planner's, by the cluster's type names,
    // which a local cluster takes from the device specs (plan/local_cluster.h).
    const bool planned_for_it =
        rank.spec ? *rank.spec == device : device.toString() == rank.device_type;
    CHORUS_CHECK_CONFIG(planned_for_it, "plan: rank ", r, " was planned for device '",
                        rank.device_type, "', but device ", rank.device, " of this job is '",
                        device.toString(), "' (devices ", toString(devices), ")");
    ordered.push_back(device);
  }
  return ordered;
}

void checkPlanForJob(const plan::Plan& plan, const JobConfig& job,
                     const std::vector<DeviceSpec>& devices) {
  const int layers = layerCount(job);
  plan.validate(layers);
  CHORUS_CHECK_CONFIG(!plan.memory_profile || plan.memory_profile->layerCount() == layers,
                      "plan: its memory profile has ", plan.memory_profile->layerCount(),
                      " layers, the job's model ", layers);
  CHORUS_CHECK_CONFIG(plan.global_batch == job.train.global_batch, "plan: global batch ",
                      plan.global_batch, ", but the job's train.global_batch is ",
                      job.train.global_batch);
  CHORUS_CHECK_CONFIG(plan.zero_stage == job.zero.stage, "plan: ZeRO stage ", plan.zero_stage,
                      ", but the job's zero.stage is ", job.zero.stage, "; set [zero] to match");
  CHORUS_CHECK_CONFIG(plan.zero_stage == 0 || plan.stageCount() == 1, "plan: ZeRO stage ",
                      plan.zero_stage, " shards one-stage replicas only, not a pipeline");
  CHORUS_CHECK_CONFIG(plan.ranks.size() == devices.size(), "plan: ", plan.ranks.size(),
                      " ranks, but the job runs on ", devices.size(), " devices (",
                      toString(devices), ")");
  // The plan's settings, which the engines run, are the job's (jobUnderPlan brought them in).
  plan::CommPlan comm = commOf(job);
  comm.codec.seed = plan.comm.codec.seed;
  CHORUS_CHECK_CONFIG(plan.comm == comm, "plan: its gradient synchronization (",
                      plan::planName(plan.comm.algorithm), ", ", toString(plan.comm.codec.kind),
                      " across nodes, sync every ", plan.comm.sync_period,
                      " steps) is not the job's [comm] (algorithm '", job.comm.algorithm,
                      "', compression '", job.comm.compression, "', sync_every ",
                      job.comm.sync_every, "); adopt the plan for the job (jobUnderPlan)");
  for (size_t r = 0; r < devices.size(); ++r) {
    const plan::RankPlan& rank = plan.ranks[r];
    CHORUS_CHECK_CONFIG(plan::jobDevice(rank) == devices[r], "plan: rank ", r, " was planned for '",
                        rank.device_type, "', but runs on '", devices[r].toString(), "'");
    CHORUS_CHECK_CONFIG(rank.emulated_speed == 1 && rank.memory_budget == 0, "plan: rank ", r,
                        " asks for an emulated speed or memory budget on top of its device '",
                        rank.device_type, "'; write them in the device spec (e.g. cpu@0.5/512MiB)");
    CHORUS_CHECK_CONFIG(rank.precision != plan::Dtype::kTf32 || job.precision.tf32, "plan: rank ",
                        r, " computes in tf32; set precision.tf32 = true in the job");
  }
  if (plan.stageCount() > 1) {
    const bool checkpoint = plan.replicas[0].stages[0].checkpoint;
    for (const auto& replica : plan.replicas)
      for (const auto& stage : replica.stages)
        CHORUS_CHECK_CONFIG(stage.checkpoint == checkpoint,
                            "plan: activation checkpointing on some stages only; the pipeline "
                            "trainer checkpoints all stages or none");
    CHORUS_CHECK_CONFIG(checkpoint || job.parallel.activation_checkpointing == "none",
                        "plan: no activation checkpointing, but the job sets "
                        "parallel.activation_checkpointing = '",
                        job.parallel.activation_checkpointing, "'");
  }
}

JobConfig jobUnderPlan(JobConfig job, const plan::Plan& plan) {
  job.comm = commUnderPlan(job.comm, plan.comm);
  if (job.zero.stage != plan.zero_stage) {
    CHORUS_CHECK_CONFIG(!job.zero.stage_given, "config key 'zero.stage': the plan runs ZeRO stage ",
                        plan.zero_stage, ", the job says ", job.zero.stage,
                        "; remove the key or run another plan");
    job.zero.stage = plan.zero_stage;
  }
  // What the plan brought in, judged with the rest of the job as a job that wrote it would be.
  if (plan.stageCount() > 1)
    checkPipelineComm(job.comm, static_cast<std::int64_t>(plan.replicas.size()));
  checkZero(job);
  checkElastic(job);
  return job;
}

AdoptedPlan adoptPlan(const plan::Plan& plan, const JobConfig& job,
                      const std::vector<DeviceSpec>& listed) {
  AdoptedPlan adopted;
  adopted.plan = inRankOrder(plan);
  adopted.devices = devicesOfPlan(adopted.plan, listed);
  for (size_t rank = 0; rank < adopted.plan.ranks.size(); ++rank) {
    adopted.plan.ranks[rank].device = static_cast<int>(rank);
    adopted.plan.ranks[rank].spec = adopted.devices[rank];
  }
  adopted.job = jobUnderPlan(job, adopted.plan);
  checkPlanForJob(adopted.plan, adopted.job, adopted.devices);
  attachMemoryProfile(adopted.plan, adopted.job, adopted.devices);
  return adopted;
}

plan::Dtype computePrecision(const plan::RankPlan& rank) {
  return rank.precision == plan::Dtype::kTf32 ? plan::Dtype::kFp32 : rank.precision;
}

std::string precisionName(const plan::RankPlan& rank) {
  return plan::toString(computePrecision(rank));
}

std::string describePlan(const plan::Plan& plan) {
  std::vector<std::string> devices, precisions;
  for (const auto& rank : plan.ranks) {
    devices.push_back(rank.device_type);
    precisions.push_back(precisionName(rank));
  }
  std::vector<int> shares;
  for (const auto& replica : plan.replicas) shares.push_back(replica.share);
  std::ostringstream text;
  if (plan.stageCount() == 1) {
    std::vector<int> micro;
    for (const auto& replica : plan.replicas) micro.push_back(replica.stages[0].micro_batch);
    text << "data parallel on " << joined(devices, ", ") << ": shares " << joined(shares, "/")
         << ", micro-batches " << joined(micro, "/");
  } else {
    std::vector<int> layers;
    for (const auto& stage : plan.replicas[0].stages)
      layers.push_back(stage.last_layer - stage.first_layer);
    text << plan.replicas.size() << (plan.replicas.size() == 1 ? " pipeline" : " pipelines")
         << " x " << plan.stageCount() << " stages on " << joined(devices, ", ") << ": layers "
         << joined(layers, "/") << ", " << plan.micro_batches << " micro-batches "
         << plan::toString(plan.schedule) << ", replica shares " << joined(shares, "/")
         << (plan.replicas[0].stages[0].checkpoint ? ", activation checkpointing" : "");
  }
  text << ", precision " << joined(precisions, "/");
  if (plan.zero_stage > 0) {
    std::vector<int> percents;
    for (double shard : plan.zero_shards) percents.push_back(static_cast<int>(shard * 100 + 0.5));
    text << ", ZeRO-" << plan.zero_stage << " shards "
         << (percents.empty() ? std::string("even") : joined(percents, "/") + " %");
  }
  return text.str();
}

}  // namespace chorus::runtime
