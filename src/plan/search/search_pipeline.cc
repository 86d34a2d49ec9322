// Pipelines and data x pipeline hybrids: the best uneven cuts of one shape (R identical replicas
// of S stages) for a micro-batch count, schedule, ZeRO stage and communication choice. Stage costs
// follow CostModel::evaluate term by term (same functions, same order), so the partition's
// objective is the plan's predicted step time.
#include <algorithm>

#include "chorus/plan/pipeline_partition.h"
#include "cost/step_terms.h"
#include "search/searchers.h"

namespace chorus::plan::detail {
namespace {

// Everything about stage s that does not depend on its layers.
struct StageContext {
  const DeviceType* type = nullptr;
  Dtype dtype = Dtype::kFp32;
  double capacity = 0;
  int in_flight = 1;
  int element = 4;
  std::vector<LinearCost> sync;    // per communication choice
  std::vector<LinearCost> gather;  // per communication choice (ZeRO-1/2)
  std::vector<LinearCost> links;   // the distinct links to stage s + 1
};

// What a stage costs apart from its synchronization: shared by all communication choices.
struct StageWork {
  bool feasible = false;
  bool checkpoint = false;
  double compute = 0;
  double forward = 0;
  double p2p = 0;
  double params = 0;
  double optimizer = 0;
};

class PipelineCosts {
 public:
  PipelineCosts(const CostModel& model, const PlanOptions& options, const PipelineShape& shape,
                int micro_batches, Schedule schedule, int zero_stage,
                const std::vector<CommPlan>& comms)
      : model_(model),
        options_(options),
        zero_(zero_stage),
        replicas_(shape.replicas()),
        micro_batch_((equalSplit(options.global_batch, shape.replicas())[0] + micro_batches - 1) /
                     micro_batches),
        micro_batches_(micro_batches),
        work_(shape.stages(), std::vector<std::vector<StageWork>>(model.model().layerCount() + 1)) {
    const Cluster& cluster = model.cluster();
    for (int s = 0; s < shape.stages(); ++s) {
      StageContext stage;
      stage.type = &cluster.device(shape.devices[0][s]).type;
      stage.dtype = CostModel::trainingDtype(*stage.type, options.precision);
      stage.capacity = model.capacity(*stage.type);
      stage.in_flight = inFlight(schedule, s, shape.stages(), micro_batches);
      std::vector<int> group;
      std::vector<Dtype> dtypes;
      for (int r = 0; r < replicas_; ++r) {
        group.push_back(shape.devices[r][s]);
        dtypes.push_back(stage.dtype);
        if (s + 1 < shape.stages())
          addDistinct(stage.links, p2pCost(cluster, shape.devices[r][s], shape.devices[r][s + 1]));
      }
      stage.element = gradElementBytes(dtypes);
      for (const CommPlan& comm : comms) {
        stage.sync.push_back(stageSyncCost(model, group, stage.element, comm, zero_stage));
        stage.gather.push_back(zeroGatherCost(model, group, comm, zero_stage));
      }
      stages_.push_back(std::move(stage));
    }
  }

  // The stage cost under communication choice `comm` (an index into the constructor's list).
  StageCost cost(int comm, int s, int first, int last) const {
    const StageWork& work = workOf(s, first, last);
    StageCost cost;
    if (!work.feasible) return cost;
    const StageContext& stage = stages_[s];
    cost.feasible = true;
    cost.time = work.compute + 2 * work.p2p;
    cost.tail = tailSeconds(stageSync(model_, stage.sync[comm], stage.element, work.params),
                            work.compute - work.forward,
                            work.optimizer + zeroGatherSeconds(stage.gather[comm], work.params));
    cost.monotone = work.compute;
    cost.tag = work.checkpoint;
    return cost;
  }

 private:
  const StageWork& workOf(int s, int first, int last) const {
    std::vector<StageWork>& row = work_[s][first];
    if (row.empty()) row.reserve(16);
    while (static_cast<int>(row.size()) < last - first)
      row.push_back(measure(s, first, first + static_cast<int>(row.size()) + 1));
    return row[last - first - 1];
  }

  StageWork measure(int s, int first, int last) const {
    const StageContext& stage = stages_[s];
    StageWork work;
    if (memory(stage, first, last, false) > stage.capacity) {
      if (!options_.allow_checkpointing || memory(stage, first, last, true) > stage.capacity)
        return work;
      work.checkpoint = true;
    }
    work.feasible = true;
    // Exactly CostModel::microBatchSeconds and forwardSeconds at speed 1, as evaluate() has them.
    const double pass = model_.forwardSeconds(*stage.type, stage.dtype, first, last, micro_batch_);
    work.compute = pass * (work.checkpoint ? 4 : 3) / 1.0;
    work.forward = pass / 1.0;
    if (!stage.links.empty()) {
      const double bytes = model_.boundaryBytes(stage.dtype, last, micro_batch_);
      for (const LinearCost& link : stage.links) work.p2p = std::max(work.p2p, link.seconds(bytes));
    }
    work.params = model_.params(first, last);
    const double shard = zero_ >= 1 ? replicas_ : 1;
    work.optimizer = model_.optimizerSeconds(*stage.type, work.params, shard);
    return work;
  }

  double memory(const StageContext& stage, int first, int last, bool checkpoint) const {
    return model_.stageMemory(stage.dtype, first, last, micro_batch_, stage.in_flight, zero_,
                              replicas_, checkpoint, micro_batches_);
  }

  const CostModel& model_;
  const PlanOptions& options_;
  int zero_;
  int replicas_;
  int micro_batch_;
  int micro_batches_;
  std::vector<StageContext> stages_;
  // Memo of measure(): work_[s][first][last - first - 1], filled on demand.
  mutable std::vector<std::vector<std::vector<StageWork>>> work_;
};

}  // namespace

double pipelineLowerBound(const CostModel& model, const PlanOptions& options,
                          const PipelineShape& shape, int micro_batches, double* sum_bound) {
  // Compute only (no transfers, memory streaming, recompute or synchronization): the stages' sum
  // is at least every layer on the fastest device, and the slowest stage at least the work spread
  // over all the stages' speeds.
  const int layers = model.model().layerCount();
  const int share = equalSplit(options.global_batch, shape.replicas())[0];
  const int micro_batch = (share + micro_batches - 1) / micro_batches;
  const double flops = 3 * model.model().totalForwardFlops() * micro_batch;
  const double overhead = 3 * layers * model.options().layer_overhead_seconds;
  double fastest = 0, total = 0;
  for (int s = 0; s < shape.stages(); ++s) {
    const DeviceType& type = model.cluster().device(shape.devices[0][s]).type;
    const Dtype dtype = CostModel::trainingDtype(type, options.precision);
    const double speed = type.peak(dtype) * model.efficiency(type, dtype);
    fastest = std::max(fastest, speed);
    total += speed;
  }
  // A hair under the exact figures, so that rounding never prunes an optimal plan.
  constexpr double kSafety = 1 - 1e-9;
  *sum_bound = (overhead + flops / fastest) * kSafety;
  const double slowest = std::max(*sum_bound / shape.stages(), flops / total * kSafety);
  return *sum_bound + (micro_batches - 1) * slowest;
}

std::optional<Plan> searchPipeline(const CostModel& model, const PlanOptions& options,
                                   const PipelineShape& shape, int micro_batches, Schedule schedule,
                                   int zero_stage, const std::vector<CommPlan>& comms,
                                   const std::function<double()>& upper_bound) {
  const PipelineCosts costs(model, options, shape, micro_batches, schedule, zero_stage, comms);
  PartitionOptions partition_options;
  pipelineLowerBound(model, options, shape, micro_batches, &partition_options.lower_bound);
  std::optional<Plan> best;
  for (size_t c = 0; c < comms.size(); ++c) {
    partition_options.upper_bound = upper_bound();
    if (best)
      partition_options.upper_bound =
          std::min(partition_options.upper_bound, best->predicted.step_seconds);
    const auto partition = partitionLayers(
        model.model().layerCount(), shape.stages(), micro_batches,
        [&](int s, int first, int last) { return costs.cost(static_cast<int>(c), s, first, last); },
        partition_options);
    if (!partition) continue;
    const std::vector<bool> checkpoint(partition->tags.begin(), partition->tags.end());
    Plan plan = pipelinePlan(model, options, shape, partition->cuts, checkpoint, micro_batches,
                             schedule, zero_stage, comms[c]);
    if (price(model, plan) && (!best || plan.predicted.step_seconds < best->predicted.step_seconds))
      best = std::move(plan);
  }
  return best;
}

std::optional<Plan> uniformPipeline(const CostModel& model, const PlanOptions& options,
                                    const PipelineShape& shape, int micro_batches,
                                    Schedule schedule, int zero_stage, const CommPlan& comm) {
  const int layers = model.model().layerCount();
  std::vector<int> cuts{0};
  for (int count : equalSplit(layers, shape.stages())) cuts.push_back(cuts.back() + count);
  const PipelineCosts costs(model, options, shape, micro_batches, schedule, zero_stage, {comm});
  std::vector<bool> checkpoint;
  for (int s = 0; s < shape.stages(); ++s) {
    const StageCost cost = costs.cost(0, s, cuts[s], cuts[s + 1]);
    if (!cost.feasible) return std::nullopt;
    checkpoint.push_back(cost.tag);
  }
  Plan plan = pipelinePlan(model, options, shape, cuts, checkpoint, micro_batches, schedule,
                           zero_stage, comm);
  if (!price(model, plan)) return std::nullopt;
  return plan;
}

}  // namespace chorus::plan::detail
