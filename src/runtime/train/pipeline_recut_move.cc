// A move of the pipeline's cut (pipeline_recut.h): the layers that change stage travel, with
// their optimizer state, from the rank that trained them to the one that takes them
// (layer_transfer.h), and every rank rebuilds its engine and optimizer over its new stage.
#include <ATen/ATen.h>
#include <torch/torch.h>

#include "chorus/core/error.h"
#include "train/layer_transfer.h"
#include "train/pipeline_recut.h"
#include "train/pipeline_stage_engine.h"

namespace chorus::runtime {
namespace {

int stageOf(const std::vector<int>& cuts, int layer) {
  int s = 0;
  while (cuts[s + 1] <= layer) ++s;
  return s;
}

// Consecutive layers [first, last) that go from stage `from` to stage `to`.
struct Group {
  int first, last, from, to;
};

std::vector<Group> movingGroups(const std::vector<int>& from, const std::vector<int>& to) {
  std::vector<Group> groups;
  for (int l = 0; l < from.back(); ++l) {
    const int a = stageOf(from, l), b = stageOf(to, l);
    if (a == b) continue;
    if (!groups.empty() && groups.back().last == l && groups.back().from == a &&
        groups.back().to == b)
      ++groups.back().last;
    else
      groups.push_back({l, l + 1, a, b});
  }
  return groups;
}

}  // namespace

ReceivedStates exchangeLayers(PipelineStageEngine& s, const std::vector<int>& from,
                              const std::vector<int>& to) {
  // Each replica moves its own layers: rank (replica, a) to rank (replica, b).
  const int replica = s.position().replica;
  const parallel::PipelineLayout& layout = s.engine->layout();
  std::vector<LayerTransfer> transfers;
  for (const Group& group : movingGroups(from, to))
    transfers.push_back({group.first, group.last, layout.rankOf(replica, group.from),
                         layout.rankOf(replica, group.to)});
  return transferLayers(
      {*s.worker->world(), *s.model, s.optimizer.get(), s.job.optimizer, s.options.timeout},
      transfers);
}

void rebuildStage(PipelineStageEngine& s, const std::vector<int>& cuts, ReceivedStates received) {
  // The old engine goes first: its reducer's destructor clears the parameters' gradient hooks,
  // which would take the new reducer's off the layers both hold. Its stage group and codec
  // engine live on in the resources.
  const parallel::PipelineResources resources = s.engineResources(s.engine.get());
  std::unique_ptr<torch::optim::Optimizer> old_optimizer = std::move(s.optimizer);
  s.engine.reset();
  s.engine = std::make_unique<parallel::PipelineEngine>(s.model, s.options, cuts, resources);
  s.holdStageLayersOnly();
  s.stage_cuts = cuts;
  s.attachUnscaler();
  s.optimizer = makeOptimizer(s.job.optimizer, s.engine->parameters());
  auto& states = s.optimizer->state();
  auto& old_states = old_optimizer->state();
  for (const at::Tensor& parameter : s.engine->parameters()) {
    void* key = parameter.unsafeGetTensorImpl();
    if (auto kept = old_states.find(key); kept != old_states.end())
      states[key] = std::move(kept->second);
    else if (auto got = received.find(key); got != received.end())
      states[key] = std::move(got->second);
  }
}

}  // namespace chorus::runtime
