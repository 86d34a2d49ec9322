// Private to runtime: what differs between plans. The Trainer (trainer.h) is one executor for
// every plan — its loop, evaluations' schedule, checkpoints, resume and stop on request are
// written once — and drives a StepEngine for what a plan's shape changes: how one step is
// computed (one stage per replica: DataParallelEngine; S > 1 stages: PipelineStageEngine), how
// the test split is evaluated, and which of this rank's state a checkpoint holds.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "chorus/core/error.h"
#include "chorus/parallel/loss_scaler.h"
#include "chorus/parallel/pipeline_layout.h"
#include "chorus/parallel/precision.h"
#include "chorus/runtime/checkpoint/checkpoint.h"
#include "chorus/runtime/train/trainer.h"

namespace chorus::runtime {

// This rank's part of a checkpoint as it is after the last completed step, independent of later
// training: the files already serialized, and the heavy ones as deep copies that serialize()
// turns into files on any thread (null: nothing heavy here). Copyable (shares the copies).
struct CheckpointSnapshot {
  std::vector<CheckpointFile> small;
  std::function<std::vector<CheckpointFile>()> serialize;
  std::vector<CheckpointFile> files() const {
    std::vector<CheckpointFile> all = small;
    if (serialize)
      for (auto& file : serialize()) all.push_back(std::move(file));
    return all;
  }
};

// A verified checkpoint being restored: its directory, manifest and trainer.json, whose common
// entries (seed, global batch, model) the executor has checked against the job. Value type.
struct CheckpointSource {
  std::string dir;
  Manifest manifest;
  nlohmann::json saved;  // trainer.json
  // The contents of file `name`, checked against the manifest. Throws CheckpointError.
  std::string read(const std::string& name) const {
    return readCheckpointFile(dir, manifest, name);
  }
  bool has(const std::string& name) const { return manifest.find(name) != nullptr; }
  // Throws CheckpointError: the checkpoint does not fit this job's `what` (was `then`, is `now`).
  [[noreturn]] void mismatch(const std::string& what, const std::string& then,
                             const std::string& now) const;
};

// What a rank keeps of its own when elastic recovery rebuilds its engine for a new generation:
// state that is this rank's alone (its loss scale, its codec's memory), not the source's.
struct LocalCarry {
  std::optional<parallel::LossScalerState> loss_scale;
  std::map<std::string, at::Tensor> codec;
};

// One rank's way of running a plan's steps. Owned by the Trainer's state; used by its thread
// only. Every member that communicates is collective: all ranks call it in the same order.
class StepEngine {
 public:
  virtual ~StepEngine() = default;

  // Runs step `step` and returns what every rank saw; the caller calls hooks.on_step.
  virtual StepRecord step(std::int64_t step, const TrainerHooks& hooks) = 0;
  // Accuracy and mean loss on the first `samples` test samples (0: all; -1: train.eval_samples),
  // the same on every rank.
  virtual std::pair<double, double> evaluate(std::int64_t samples) = 0;

  // The engine's entries of trainer.json (rank 0 writes it): the layout it needs to resume and
  // the balancer's state.
  virtual nlohmann::json checkpointEntries() const = 0;
  // This rank's files of a checkpoint of the state after the last completed step.
  virtual CheckpointSnapshot snapshot() = 0;
  // Restores this rank's state; throws CheckpointError when the checkpoint's layout is not one
  // this engine can continue.
  virtual void restore(const CheckpointSource& source) = 0;

  // The plan as it runs now: this rank's (replica, stage), the layer cuts, the samples per
  // replica of the next step, the parameters this rank trains, its compute format.
  virtual parallel::StagePosition position() const = 0;
  virtual const std::vector<int>& cuts() const = 0;
  virtual const std::vector<std::int64_t>& shares() const = 0;
  virtual const std::vector<at::Tensor>& parameters() const = 0;
  // Copies of parameters()' values. Collective under ZeRO-3, whose parameters hold no values
  // between steps: every rank calls it.
  virtual std::vector<at::Tensor> parameterValues() {
    std::vector<at::Tensor> values;
    for (const at::Tensor& parameter : parameters()) values.push_back(parameter.detach().clone());
    return values;
  }
  virtual parallel::Precision precision() const = 0;
  // 0 when the rank does not scale its loss.
  virtual double lossScale() const = 0;
  virtual device::EmulationTotals emulationTotals() const = 0;
  // Steps skipped on gradient overflow so far (resumed ones included).
  virtual std::int64_t skippedSteps() const = 0;

  // Elastic recovery (elastic_recovery.cc). The engine of the survivor whose state the new
  // generation starts from writes the handover: the model, the optimizer state, the steps skipped,
  // and the balancer state of the survivors `kept` (old ranks, ascending) followed by any joiners,
  // with `next_shares` (one per kept rank, then one per joiner). Not collective. Engines that
  // cannot recover throw ConfigError.
  virtual std::string handover(const std::vector<int>& kept,
                               const std::vector<std::int64_t>& next_shares) {
    (void)kept;
    (void)next_shares;
    CHORUS_THROW(ConfigError, "elastic recovery runs data parallelism only");
  }
  // This rank's own state to keep across the rebuild.
  virtual LocalCarry localCarry() const { return {}; }
  // A new engine (of the new generation) takes the handover and this rank's carry.
  virtual void adopt(const std::string& handover, const LocalCarry& carry) {
    (void)handover;
    (void)carry;
    CHORUS_THROW(ConfigError, "elastic recovery runs data parallelism only");
  }
};

// Accuracy and mean loss from all-reduced evaluation totals {correct, predictions, summed loss,
// samples} (kDouble).
std::pair<double, double> evaluationResult(const at::Tensor& totals);

}  // namespace chorus::runtime
