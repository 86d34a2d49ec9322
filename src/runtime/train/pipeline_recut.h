// Private to runtime: the adaptive cut of a pipeline job (parallel.recut, docs/pipeline.md) in
// the pipeline stage engine. The decision is parallel::RecutPolicy's (pure, the same on every
// rank); this is its execution: after a step, the layers that change stage carry their
// parameters and optimizer state from the rank that trained them to the one that takes them
// (in every replica, rank(r, s) to rank(r, s'), point to point with the job's deadline), then
// every rank rebuilds its parallel::PipelineEngine and its optimizer over its new stage.
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chorus/core/device_spec.h"
#include "chorus/parallel/pipeline_recut.h"
#include "chorus/runtime/train/trainer.h"
#include "train/layer_transfer.h"

namespace chorus::runtime {

struct PipelineStageEngine;

// pipeline_recut_move.cc. Sends (layer_transfer.h) the layers this rank trains under `from` and not
// under `to` to their new stage in its replica (parameter values and optimizer state), and receives
// the ones it takes (values copied into the model in place). Collective over the ranks of the
// replica whose layers move; blocks with the job's deadline (TimeoutError).
ReceivedStates exchangeLayers(PipelineStageEngine& s, const std::vector<int>& from,
                              const std::vector<int>& to);
// A new engine and optimizer over stage `cuts`: kept parameters keep their optimizer state,
// received ones take theirs from `received`, the rest start fresh; the stage's gradient group
// is the old engine's. Not collective.
void rebuildStage(PipelineStageEngine& s, const std::vector<int>& cuts, ReceivedStates received);

// One rank's side of the adaptive cut. Owned by the stage engine; used by its thread only;
// non-copyable. afterStep() and adopt() are collective over the world: every rank calls them
// after the same step.
class PipelineRecut {
 public:
  // `devices`: every rank's device as the plan names it (rank order); `memory`: the plan's memory
  // model when a device has a budget (planMemoryModelForBudgets), else null. The policy runs when
  // parallel.recut = "adaptive" (checkRecut, pipeline_job.h, first); otherwise only
  // TrainerHooks::cut_at moves the cut.
  PipelineRecut(PipelineStageEngine& stage, const std::vector<DeviceSpec>& devices,
                std::shared_ptr<const plan::MemoryModel> memory);
  PipelineRecut(const PipelineRecut&) = delete;
  PipelineRecut& operator=(const PipelineRecut&) = delete;

  // After step `step`, whose `record` holds every rank's figures and the shares it ran with:
  // feeds the policy, moves the cut when it or hooks.cut_at says so, and says what happened in
  // record.recut (a move, and a move's measured gain a window later).
  void afterStep(std::int64_t step, const TrainerHooks& hooks, StepRecord& record);
  // A checkpoint's cut, taken at resume after step `step` - 1: rebuilds on it with nothing
  // carried (each rank then reads its new stage from the checkpoint). Throws CheckpointError
  // when it does not fit a device's memory budget.
  void adopt(const std::vector<int>& cuts, std::int64_t step);

 private:
  void moveTo(const std::vector<int>& cuts);

  PipelineStageEngine& s_;
  parallel::CutRequest request_;
  std::optional<parallel::RecutPolicy> policy_;
};

}  // namespace chorus::runtime
