// The pipeline engine: one rank's stage of a pipeline-parallel (or data × pipeline) training job.
//
// Every rank holds a PipelineEngine for its (replica, stage) (pipeline_layout.h). step() splits
// the replica's share of a global batch into M micro-batches, executes the stage's program of the
// schedule (pipeline_schedule.h) — receive, forward, send; receive, backward, send — with
// asynchronous point-to-point transfers to the neighbouring stages, and all-reduces the stage's
// gradients across the replicas (one group per stage index; bucket by bucket, launched during the
// last micro-batch's backward, as the data-parallel reducer does) and divides them by the global
// batch B. Every stage back-propagates the SUM of its samples' losses, so after step() each stage's
// .grad equals single-process training on the mean loss of the global batch (invariant 1), and
// the caller steps its optimizer over parameters().
//
//   world rank = replica · S + stage
//   stage s of replica r:   receives from rank(r, s-1), sends to rank(r, s+1)
//   gradient all-reduce:    ranks {rank(r, s) : r}, one subgroup per s (none when R = 1)
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "chorus/comm/communicator.h"
#include "chorus/device/memory_meter.h"
#include "chorus/device/speed_emulator.h"
#include "chorus/model/zoo_model.h"
#include "chorus/parallel/gradient_reducer.h"
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
  // The replicas' gradient all-reduce (R > 1): bucket sizes, overlap with the last micro-batch's
  // backward, a codec (shared, so the caller can checkpoint its state; it compresses every
  // bucket among the stage's R ranks). `hierarchical` must be null, or with a codec the previous
  // engine's replicaSyncEngine() when a new cut rebuilds the engine (as `stage_group`: creating
  // the codec's engine again would reuse its groups' names); `hold_launch` must be empty: the
  // engine releases buckets at the emulated device's pace, as the data-parallel trainer does.
  // Default: the reducer's defaults (no codec).
  ReducerOptions replica_sync;
  // The stage's gradient group across the replicas ({rank(r, s) : r}) to use instead of creating
  // one, e.g. the previous engine's stageGroup() when a new cut rebuilds the engine (its members
  // do not depend on the cut). Default: null, meaning the constructor creates it (collective).
  std::shared_ptr<comm::Communicator> stage_group;
};

// How one step's backwards are seeded. Value type.
struct StepScaling {
  // The stage's loss scale (fp16 stages; precision.h): its backward's seed is multiplied by it,
  // so its parameter gradients arrive S times too large and the caller's GradientUnscaler over
  // parameters() divides them; the gradient sent to the previous stage is unscaled. Default: 1.
  double loss_scale = 1.0;
  // Seeds the last micro-batch's backward with infinity (tests of overflow consensus).
  // Default: false.
  bool inject_overflow = false;
};

// When one action of the stage's program ran, for a timeline: a forward or backward (padding
// included), or the wait of a receive. Value type.
struct ActionSpan {
  ActionKind kind = ActionKind::kForward;
  int micro_batch = 0;
  std::chrono::steady_clock::time_point start;
  std::chrono::steady_clock::time_point end;
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
  // The cross-replica all-reduce after the schedule (what its overlap with the last backward
  // did not hide) and the division by B.
  double sync_seconds = 0;
  // 1 - compute / schedule: the stage's bubble, as measured.
  double idle_fraction = 0;
  // Buckets of the replicas' gradient all-reduce, and how many of them were launched during the
  // last micro-batch's backward (overlapped with it); both 0 without replicas.
  int sync_buckets = 0;
  int sync_buckets_overlapped = 0;
  // Whether every gradient the step left in .grad is finite (after the all-reduce: an overflow
  // on any replica shows on all of them). The caller's overflow consensus needs every stage's.
  bool gradients_finite = true;
  // Peak of the MemoryAccount during the step (0 without one).
  std::uint64_t peak_bytes = 0;
  // Peak of the bytes the stage held between forwards and backwards (inputs, outputs, layer
  // boundaries; not the autograd graph's internals).
  std::uint64_t peak_held_bytes = 0;
  // Most micro-batches held at once.
  int max_in_flight = 0;
  // Every compute action and receive of the step, in program order, and the replicas'
  // all-reduce after the schedule (start == end without replicas).
  std::vector<ActionSpan> spans;
  std::chrono::steady_clock::time_point sync_start;
  std::chrono::steady_clock::time_point sync_end;
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
  PipelineStepStats step(const at::Tensor& inputs, const at::Tensor& targets,
                         const StepScaling& scaling = {});

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
  // The engine the replicas' codec runs on (null without replicas or codec), for a rebuild to
  // reuse (PipelineResources::replica_sync).
  const std::shared_ptr<comm::HierarchicalAllReduce>& replicaSyncEngine() const {
    return sync_engine_;
  }
  // The checkpointing this stage applies: the option, except kNone on a stage that never holds
  // more than one micro-batch (recomputing would save nothing there).
  Checkpointing checkpointing() const;

 private:
  void runProgram(const at::Tensor& inputs, const at::Tensor& targets,
                  const std::vector<std::int64_t>& sizes, PipelineStepStats& stats);
  void prefetchAfter(std::size_t index);
  // Launches the buckets the reducer held back during `phase`, each when the emulated device
  // would have had its gradients ready.
  void releaseHeldBuckets(device::SpeedEmulator::ComputeScope& phase);
  void synchronizeGradients(PipelineStepStats& stats);
  bool gradientsFinite() const;

  std::shared_ptr<model::ZooModel> model_;
  PipelineOptions options_;
  std::vector<int> cuts_;
  PipelineResources resources_;
  PipelineLayout layout_;
  StagePosition position_;
  StageProgram program_;
  std::vector<at::Tensor> parameters_;
  std::shared_ptr<comm::Communicator> stage_group_;           // null when R = 1
  std::shared_ptr<comm::HierarchicalAllReduce> sync_engine_;  // with a codec and R > 1
  std::unique_ptr<GradientReducer> reducer_;                  // null when R = 1
  // The program's last backward, before which the reducer is armed.
  std::size_t final_backward_ = 0;
  // The compute phase running now, and where in it the buckets held back became ready.
  device::SpeedEmulator::ComputeScope* phase_ = nullptr;
  std::vector<double> held_at_;
  // Buckets made ready (launched or held) while the program ran, this step.
  int buckets_in_schedule_ = 0;
  bool in_schedule_ = false;
  std::unique_ptr<detail::StageLink> link_;
  std::unique_ptr<detail::StageRunner> runner_;
};

}  // namespace chorus::parallel
