// The pipeline engine: one rank's stage of a pipeline-parallel (or data × pipeline) training job.
//
// Every rank holds a PipelineEngine for its (replica, stage) (pipeline_layout.h). step() splits
// the replica's share of a global batch into M micro-batches, executes the stage's program of the
// schedule (pipeline_schedule.h) — receive, forward, send; receive, backward, send — with
// asynchronous point-to-point transfers to the neighbouring stages, then all-reduces the stage's
// gradients across the replicas (one group per stage index) and divides them by the global batch
// B. Every stage back-propagates the SUM of its samples' losses, so after step() each stage's
// .grad equals single-process training on the mean loss of the global batch (invariant 1), and
// the caller steps its optimizer over parameters().
//
//   world rank = replica · S + stage
//   stage s of replica r:   receives from rank(r, s-1), sends to rank(r, s+1)
//   gradient all-reduce:    ranks {rank(r, s) : r}, one subgroup per s (none when R = 1)
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "chorus/comm/communicator.h"
#include "chorus/device/memory_meter.h"
#include "chorus/device/speed_emulator.h"
#include "chorus/model/zoo_model.h"
#include "chorus/parallel/pipeline_layout.h"
#include "chorus/parallel/pipeline_schedule.h"

namespace chorus::parallel {

namespace detail {
class StageLink;
class StageRunner;
}  // namespace detail

// What the engine runs on; the caller owns all of it. Value type.
struct PipelineResources {
  // Every rank of the job (R · S), ranked as PipelineLayout says. REQUIRED.
  std::shared_ptr<comm::Communicator> world;
  // Pads each forward and backward to the emulated device's speed. Default: null (no padding).
  // Must outlive the engine.
  device::SpeedEmulator* emulator = nullptr;
  // Charged with the stage's allocations during step() (needs an installed MemoryMeter to count).
  // Default: null (peak_bytes reads 0).
  std::shared_ptr<device::MemoryAccount> memory;
  // The stage's gradient group across the replicas ({rank(r, s) : r}) to use instead of creating
  // one, e.g. the previous engine's stageGroup() when a new cut rebuilds the engine (its members
  // do not depend on the cut). Default: null, meaning the constructor creates it (collective).
  std::shared_ptr<comm::Communicator> stage_group;
};

// One step's measurements on this stage. Value type.
struct PipelineStepStats {
  // Last stage: Σ over the replica's share of the per-sample losses. Other stages: 0.
  double loss_sum = 0;
  // The whole step: schedule plus gradient synchronization.
  double step_seconds = 0;
  // The schedule alone (first action to last send finished).
  double schedule_seconds = 0;
  // Forward and backward compute, emulator padding included.
  double compute_seconds = 0;
  // Blocked on receives and sends.
  double transfer_wait_seconds = 0;
  // The cross-replica all-reduce and the division by B.
  double sync_seconds = 0;
  // 1 - compute / schedule: the stage's bubble, as measured.
  double idle_fraction = 0;
  // Peak of the MemoryAccount during the step (0 without one).
  std::uint64_t peak_bytes = 0;
  // Peak of the bytes the stage held between forwards and backwards (inputs, outputs, layer
  // boundaries; not the autograd graph's internals).
  std::uint64_t peak_held_bytes = 0;
  // Most micro-batches held at once.
  int max_in_flight = 0;
};

// One rank's stage. Owns its transfers and its gradient group; shares the model with the caller
// (only layers [firstLayer(), lastLayer()) are used; build the whole model with the job's seed on
// every rank and each stage starts from the same parameters as single-process training).
// Used by one thread; non-copyable. The constructor is collective when R > 1 and no
// resources.stage_group is given (all ranks of the stage's group create it).
class PipelineEngine {
 public:
  // `cuts` from stageCuts() (every rank the same). Throws ConfigError when the options, the cuts
  // or the communicator's size do not fit together.
  PipelineEngine(std::shared_ptr<model::ZooModel> model, const PipelineOptions& options,
                 std::vector<int> cuts, PipelineResources resources);
  ~PipelineEngine();
  PipelineEngine(const PipelineEngine&) = delete;
  PipelineEngine& operator=(const PipelineEngine&) = delete;

  // Runs one training step on this replica's share. `inputs` and `targets` hold the replica's
  // share (share rows, in order); the first stage needs `inputs`, the last `targets`, and the
  // others may pass undefined tensors. Afterwards parameters() hold in .grad the global-batch
  // gradient (sum / B). Blocks until the stage's transfers and all-reduce finished or a deadline
  // passed (TimeoutError, PeerFailure).
  PipelineStepStats step(const at::Tensor& inputs, const at::Tensor& targets);

  // New replica shares from the next step on (a load balancer's rebalancing); every rank must
  // set the same. ConfigError unless they sum to B and each is >= M.
  void setReplicaShares(std::vector<std::int64_t> shares);
  // Pads compute with `emulator` from the next step on (null: no padding), e.g. when a test
  // changes the emulated speed mid-run. Must outlive the engine or the next call.
  void setEmulator(device::SpeedEmulator* emulator) { resources_.emulator = emulator; }

  // This stage's trainable parameters, in the model's order.
  const std::vector<at::Tensor>& parameters() const { return parameters_; }
  const PipelineLayout& layout() const { return layout_; }
  StagePosition position() const { return position_; }
  int firstLayer() const { return cuts_[position_.stage]; }
  int lastLayer() const { return cuts_[position_.stage + 1]; }
  const StageProgram& program() const { return program_; }
  // The stage's gradient group across the replicas (null when R = 1).
  const std::shared_ptr<comm::Communicator>& stageGroup() const { return stage_group_; }
  // The checkpointing this stage applies: the option, except kNone on a stage that never holds
  // more than one micro-batch (recomputing would save nothing there).
  Checkpointing checkpointing() const;

 private:
  void runProgram(const at::Tensor& inputs, const at::Tensor& targets,
                  const std::vector<std::int64_t>& sizes, PipelineStepStats& stats);
  void prefetchAfter(std::size_t index);
  void synchronizeGradients(PipelineStepStats& stats);

  std::shared_ptr<model::ZooModel> model_;
  PipelineOptions options_;
  std::vector<int> cuts_;
  PipelineResources resources_;
  PipelineLayout layout_;
  StagePosition position_;
  StageProgram program_;
  std::vector<at::Tensor> parameters_;
  std::shared_ptr<comm::Communicator> stage_group_;  // null when R = 1
  std::unique_ptr<detail::StageLink> link_;
  std::unique_ptr<detail::StageRunner> runner_;
};

}  // namespace chorus::parallel
