// The elastic recovery of a pipeline job (pipeline_regroup.h): the next plan over the members'
// devices, and the layers' journey from the members that hold them to the ranks that take them.
#include "train/pipeline_regroup.h"

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include "chorus/core/error.h"
#include "chorus/core/logging.h"
#include "chorus/plan/plan_json.h"
#include "chorus/runtime/job/survivor_plan.h"
#include "train/data_parallel_engine.h"
#include "train/pipeline_stage_engine.h"

namespace chorus::runtime {
namespace {

torch::optim::Optimizer* optimizerOf(StepEngine* engine) {
  if (auto* stage = dynamic_cast<PipelineStageEngine*>(engine)) return stage->optimizer.get();
  if (auto* replica = dynamic_cast<DataParallelEngine*>(engine))
    return replica->replicatedOptimizer();
  return nullptr;
}

// Layers [first, last) held at `step`; step -1: none.
struct Holding {
  std::int64_t first = 0, last = 0, step = -1;
  bool holds(int layer, std::int64_t at) const {
    return step == at && first <= layer && layer < last;
  }
};

Holding holdingOf(const Trainer::State& s) {
  if (!s.engine || s.layers_unsure) return {};
  const std::vector<int>& cuts = s.engine->cuts();
  const int stage = s.engine->position().stage;
  return {cuts.at(stage), cuts.at(stage + 1), s.next_step};
}

// Every rank's holding, in rank order (collective).
std::vector<Holding> gatherHoldings(comm::Communicator& world, const Holding& mine) {
  at::Tensor in = at::tensor({mine.first, mine.last, mine.step}, at::kLong);
  at::Tensor all = at::empty({3 * static_cast<std::int64_t>(world.size())}, at::kLong);
  world.allGather(in, all).wait();
  std::vector<Holding> holdings;
  for (int r = 0; r < world.size(); ++r)
    holdings.push_back({all[3 * r].item<std::int64_t>(), all[3 * r + 1].item<std::int64_t>(),
                        all[3 * r + 2].item<std::int64_t>()});
  return holdings;
}

// Layers [first, last) of each rank of `plan` (rank order).
std::vector<std::pair<int, int>> rangesOf(const plan::Plan& plan) {
  std::vector<std::pair<int, int>> ranges(plan.ranks.size());
  for (const plan::ReplicaPlan& replica : plan.replicas)
    for (const plan::StagePlan& stage : replica.stages)
      ranges.at(stage.rank) = {stage.first_layer, stage.last_layer};
  return ranges;
}

// Who sends which layers to whom: every layer a rank takes and does not hold at `step` comes from
// the lowest rank that does. Nullopt when a layer has no holder. Pure: every rank computes the
// same from the same holdings.
std::optional<std::vector<LayerTransfer>> transfersFor(const std::vector<Holding>& holdings,
                                                       const plan::Plan& plan, std::int64_t step) {
  std::vector<LayerTransfer> transfers;
  const auto ranges = rangesOf(plan);
  for (int to = 0; to < static_cast<int>(ranges.size()); ++to) {
    for (int layer = ranges[to].first; layer < ranges[to].second; ++layer) {
      if (holdings.at(to).holds(layer, step)) continue;
      int from = 0;
      while (from < static_cast<int>(holdings.size()) && !holdings[from].holds(layer, step)) ++from;
      if (from == static_cast<int>(holdings.size())) return std::nullopt;
      if (!transfers.empty() && transfers.back().to == to && transfers.back().from == from &&
          transfers.back().last == layer)
        ++transfers.back().last;
      else
        transfers.push_back({layer, layer + 1, from, to});
    }
  }
  return transfers;
}

// The old optimizer's states of the parameters of layers [first, last) that this rank keeps.
void keepStates(Trainer::State& s, std::pair<int, int> range, ReceivedStates& states) {
  torch::optim::Optimizer* optimizer = optimizerOf(s.engine.get());
  if (optimizer == nullptr) return;
  auto& old = optimizer->state();
  for (int layer = range.first; layer < range.second; ++layer)
    for (const at::Tensor& parameter : s.context->model->layerParameters(layer)) {
      auto found = old.find(parameter.unsafeGetTensorImpl());
      if (found != old.end()) states[parameter.unsafeGetTensorImpl()] = std::move(found->second);
    }
}

// The header proper (pipelineHeader); throws ConfigError where no plan fits the members.
std::string plannedHeader(const Trainer::State& s, const Generation& next) {
  std::vector<plan::RankPlan> ranks;
  nlohmann::json slots = nlohmann::json::array();
  for (int member : next.members) {
    const auto joined = next.joined.find(member);
    const int slot = joined != next.joined.end() ? joined->second : slotOf(s, member);
    // A new device cannot join a pipeline job (checkNewDeviceJoin refuses it at its start).
    CHORUS_CHECK_CONFIG(slot != kNewDevice, "elastic: rank ", member,
                        " brings a new device, which a pipeline job does not take");
    ranks.push_back(s.launch_plan.ranks.at(slot));
    slots.push_back({member, slot});
  }
  const plan::Plan next_plan = survivorPipelinePlan(
      s.context->job, s.launch_plan, ranks, static_cast<int>(s.context->model->numLayers()));
  return nlohmann::json{
      {"plan", plan::toJson(next_plan)}, {"slots", slots}, {"launch", plan::toJson(s.launch_plan)}}
      .dump();
}

}  // namespace

std::string pipelineHeader(const Trainer::State& s, const Generation& next) {
  try {
    return plannedHeader(s, next);
  } catch (const ConfigError& error) {
    return nlohmann::json{{"error", error.message()}}.dump();
  }
}

std::optional<ReceivedStates> layersFromMembers(Trainer::State& s, const plan::Plan& next_plan,
                                                std::int64_t step, const TrainerHooks& hooks) {
  TrainingContext& c = *s.context;
  comm::Communicator& world = *c.worker->world();
  const std::vector<Holding> holdings = gatherHoldings(world, holdingOf(s));
  const auto transfers = transfersFor(holdings, next_plan, step);
  if (!transfers) return std::nullopt;
  // From here the model's values change in place: should the move fail, this rank's layers are
  // of no known step.
  s.layers_unsure = true;
  if (hooks.at_point) hooks.at_point(step, "regroup");
  ReceivedStates states =
      transferLayers({world, *c.model, optimizerOf(s.engine.get()), c.job.optimizer,
                      std::chrono::milliseconds(c.worker->identity().timeout_ms)},
                     *transfers);
  const Holding mine = holdings.at(world.rank());
  const auto range = rangesOf(next_plan).at(world.rank());
  if (mine.step == step)
    keepStates(s, {std::max<int>(range.first, mine.first), std::min<int>(range.second, mine.last)},
               states);
  if (world.rank() == 0)
    logInfo("elastic: the layers of step ", step, " come from the members that hold them (",
            transfers->size(), " moves), no step redone");
  return states;
}

void installLayerStates(StepEngine& engine, ReceivedStates states) {
  torch::optim::Optimizer* optimizer = optimizerOf(&engine);
  CHORUS_CHECK_CONFIG(optimizer != nullptr, "elastic: the next engine has no optimizer");
  auto& live = optimizer->state();
  for (const auto& group : optimizer->param_groups())
    for (const at::Tensor& parameter : group.params()) {
      void* key = parameter.unsafeGetTensorImpl();
      live.erase(key);
      if (auto found = states.find(key); found != states.end())
        live[key] = std::move(found->second);
    }
}

}  // namespace chorus::runtime
