// The data-parallel engine's construction: the gradient reducer (buckets, hierarchy, codec), the
// rank's precision and loss scaler, the balancer's start, and the micro-batch a memory budget
// allows by the job's memory model.
#include <ATen/ATen.h>
#include <torch/torch.h>

#include <algorithm>

#include "chorus/core/error.h"
#include "chorus/core/logging.h"
#include "chorus/core/units.h"
#include "chorus/device/memory_budget.h"
#include "chorus/runtime/job/job_plan.h"
#include "chorus/runtime/job/memory_calibration.h"
#include "chorus/runtime/train/gradient_path.h"
#include "job/balancer_settings.h"
#include "job/job_sections.h"
#include "train/data_parallel_engine.h"
#include "train/engine_settings.h"

namespace chorus::runtime {
namespace {

// The parameter indices (into `parameters`, the model's) of each layer of `model`.
std::vector<std::vector<int>> layerIndices(const model::ZooModel& model,
                                           const std::vector<at::Tensor>& parameters) {
  std::map<const void*, int> index;
  for (size_t i = 0; i < parameters.size(); ++i)
    index[parameters[i].unsafeGetTensorImpl()] = static_cast<int>(i);
  std::vector<std::vector<int>> layers(model.numLayers());
  for (std::int64_t l = 0; l < model.numLayers(); ++l)
    for (const at::Tensor& parameter : model.layerParameters(l))
      layers[l].push_back(index.at(parameter.unsafeGetTensorImpl()));
  return layers;
}

// Collective: every rank's micro-batch limit, by rank.
std::vector<std::int64_t> everyRanksLimit(comm::Communicator& world, std::int64_t limit) {
  at::Tensor mine = at::tensor({static_cast<double>(limit)}, at::kDouble);
  at::Tensor all = at::empty({world.size()}, at::kDouble);
  world.allGather(mine, all).wait();
  std::vector<std::int64_t> limits;
  for (int r = 0; r < world.size(); ++r)
    limits.push_back(static_cast<std::int64_t>(all[r].item<double>()));
  return limits;
}

// Each rank's start share under `plan`, by rank. Throws ConfigError unless the plan has one stage
// per replica (the executor checked its ranks against the world).
std::vector<std::int64_t> planShares(const plan::Plan& plan, int ranks) {
  CHORUS_CHECK_CONFIG(plan.stageCount() == 1, "data parallelism: a plan of ", plan.stageCount(),
                      " stages per replica is run by the pipeline engine");
  std::vector<std::int64_t> shares(ranks, 0);
  for (const plan::ReplicaPlan& replica : plan.replicas)
    shares.at(replica.stages.at(0).rank) = replica.share;
  return shares;
}

// The plan's micro-batch for this rank when it asks for accumulation, else the job's limit.
std::int64_t planMicroBatch(const plan::Plan& plan, const JobConfig& job, int rank) {
  for (const plan::ReplicaPlan& replica : plan.replicas)
    if (replica.stages.at(0).rank == rank && replica.stages[0].micro_batch < replica.share)
      return replica.stages[0].micro_batch;
  return job.train.micro_batch;
}

}  // namespace

// Buckets, the path over the job's devices (gradient_path.h: collective) and the codec.
parallel::ReducerOptions DataParallelEngine::reducerOptions() {
  parallel::ReducerOptions options = reducerBuckets(comm_);
  options.skip_alone = !job_.elastic.enabled;
  // Holds a bucket back when it is ready inside an emulated compute phase, noting how far the
  // phase had got (runShare launches it at the emulated moment); launches after the phase
  // (finish(), overlap off) find none and go out at once. The engine outlives the reducer it owns.
  options.hold_launch = [this](int /*bucket*/) {
    if (phase_ == nullptr || !emulator_->emulated()) return false;
    held_at_.push_back(phase_->computeSoFar());
    return true;
  };
  const std::string path = chooseGradientPath(*worker_, comm_.algorithm, options);
  if (!path.empty() && worker_->rank() == 0) logInfo("gradient all-reduce: ", path);
  codec_ = planCodec(comm_);
  options.codec = codec_;
  return options;
}

// ZeRO (plan.zero_stage >= 1): the optimizer of this rank's slice of the parameters flattened in
// the reducer's bucket order; for stage 2 and up, the reducer's reduce-scatter into the slice; for
// stage 3, the layers gathered from the slices, over a group of their own (zero_layers.h).
void DataParallelEngine::setUpZero(const plan::Plan& plan, parallel::ReducerOptions& reducing) {
  const std::vector<at::Tensor> parameters = model_->parameters();
  std::int64_t elements = 0;
  for (const at::Tensor& parameter : parameters) elements += parameter.numel();
  const int ranks = worker_->worldSize();
  const std::vector<double> fractions =
      plan.zero_shards.empty() ? std::vector<double>(ranks, 1.0) : plan.zero_shards;
  const std::vector<std::int64_t> bounds = parallel::shardBounds(elements, fractions);
  const OptimizerSection& optimizer = job_.optimizer;
  zero_ = std::make_unique<parallel::ZeroOptimizer>(
      plan.zero_stage, parameters,
      parallel::flatOrder(parallel::bucketLayoutOf(parameters, reducing)), bounds, worker_->world(),
      [&optimizer](std::vector<at::Tensor> slice) { return makeOptimizer(optimizer, slice); },
      /*redundant=*/job_.zero.redundancy > 0);
  if (plan.zero_stage >= 2) {
    reducing.scatter_bounds = bounds;
    reducing.scatter_output = zero_->gradientSlice();
  }
  if (plan.zero_stage >= 3) {
    std::vector<int> everyone(ranks);
    for (int r = 0; r < ranks; ++r) everyone[r] = r;
    zero_layers_ = std::make_unique<parallel::ZeroLayers>(
        parameters, layerIndices(*model_, parameters), zero_->order(), bounds, zero_->masterSlice(),
        worker_->world()->subgroup(everyone, "zero-gather"));
    // Waiting for a peer's piece of a layer is no compute of this rank (the balancer's input).
    zero_layers_->setWaitHooks({[this] {
                                  if (phase_ != nullptr) phase_->pauseForWait();
                                },
                                [this] {
                                  if (phase_ != nullptr) phase_->resume();
                                }});
  }
  if (worker_->rank() != 0) return;
  std::string slices;
  for (int r = 0; r < ranks; ++r)
    slices += (r ? "/" : "") + std::to_string(bounds[r + 1] - bounds[r]);
  logInfo("ZeRO stage ", plan.zero_stage, ": parameter slices of ", slices, " elements",
          plan.zero_shards.empty() ? " (even)" : " (sized by the plan's shards)",
          zero_->redundant() ? "; each rank keeps a replica of the next rank's slice" : "");
}

// The rank's compute format (the plan's), and a loss scaler when it is fp16.
void DataParallelEngine::setUpPrecision(const plan::RankPlan& rank) {
  compute_precision_ = computePrecision(rank);
  parallel::allowTf32(job_.precision.tf32, job_.precision.conv_tf32);
  if (!parallel::needsLossScaling(compute_precision_)) return;
  const DeviceSpec& device = worker_->identity().device;
  scaler_.emplace(lossScalerOptions(
      job_.precision, device.kind,
      device.kind == DeviceKind::kCuda ? cudaComputeCapability(device.index) : ""));
  unscaler_ = std::make_unique<parallel::GradientUnscaler>(model_->parameters());
}

DataParallelEngine::DataParallelEngine(TrainingContext& context, const plan::Plan& plan)
    : job_(context.job),
      worker_(context.worker),
      data_(context.data),
      sampler_(context.sampler),
      model_(context.model) {
  comm::Communicator& world = *worker_->world();
  const std::vector<std::int64_t> start_shares = planShares(plan, world.size());
  global_batch_ = plan.global_batch;
  comm_ = plan.comm;
  cuts_ = {0, static_cast<int>(model_->numLayers())};
  model_parameters_ = model_->parameters();
  parallel::ReducerOptions reducing = reducerOptions();
  CHORUS_CHECK_CONFIG(plan.zero_stage == 0 || comm_.sync_period == 1,
                      "data parallelism: ZeRO does not combine with local SGD (comm.sync_every)");
  if (plan.zero_stage >= 1)
    setUpZero(plan, reducing);
  else
    optimizer_ = makeOptimizer(job_.optimizer, model_->parameters());
  reducer_ =
      std::make_unique<parallel::GradientReducer>(model_->parameters(), worker_->world(), reducing);
  setUpPrecision(plan.ranks.at(world.rank()));
  if (world.rank() == 0) {
    // A CPU rank's intra-op threads (device::intraOpThreads): what its speed depends on.
    const bool cpu = worker_->device().is_cpu();
    logInfo("world: ", world.size(), " ranks, CPU collectives over ", world.cpuTransport(),
            ", rank 0 computes in ", plan::toString(compute_precision_),
            cpu ? detail::concat(" on ", at::get_num_threads(), " thread(s)") : std::string());
  }
  // balancer.shares fixes the shares: the balancer does not run.
  if (!job_.balancer.shares.empty()) fixed_shares_ = start_shares;
  plan::BalancerOptions balancing = balancerOptions(job_.balancer);
  balancing.initial_shares = start_shares;
  for (const plan::RankPlan& rank : plan.ranks) balancing.rank_names.push_back(rank.device_type);
  balancer_ = std::make_unique<plan::LoadBalancer>(balancing, world.size(), global_batch_,
                                                   std::vector<std::int64_t>(world.size(), 0));
  speed_ = worker_->identity().device.speed;
  emulator_ = &worker_->emulator();
  const auto& budget = worker_->identity().device.memory_budget;
  // The plan's memory profile (measured once by the front end; memory_calibration.h).
  micro_limit_ =
      budget ? plan::maxMicroBatch(
                   planMemoryModel(job_, plan), plan.ranks.at(world.rank()).precision, *budget,
                   worker_->identity().device.toString(), plan.zero_stage, world.size(),
                   plan.zero_shards.empty() ? 0 : plan.zero_shards.at(world.rank()),
                   replicaFraction(job_.zero, plan.zero_shards, world.rank(), world.size()))
             : 0;
  const std::int64_t planned_micro = planMicroBatch(plan, job_, world.rank());
  if (planned_micro > 0)
    micro_limit_ = micro_limit_ > 0 ? std::min(micro_limit_, planned_micro) : planned_micro;
  if (zero_layers_) micro_limits_ = everyRanksLimit(world, micro_limit_);
  // Data and model are in place: from here on the budget counts what training allocates.
  if (budget) {
    worker_->enforceMemoryBudget();
    logInfo("memory budget ", formatBytes(*budget), ": micro-batches of at most ", micro_limit_,
            " samples");
  }
}

std::unique_ptr<StepEngine> makeDataParallelEngine(TrainingContext& context,
                                                   const plan::Plan& plan) {
  return std::make_unique<DataParallelEngine>(context, plan);
}

}  // namespace chorus::runtime
