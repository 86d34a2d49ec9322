// The C++ half of chorus.DataParallel and chorus.step: one rank's gradient reducer on a Python
// module's parameters, its compute phases (timed, and padded when the device is emulated), the
// per-step figures every rank all-gathers, and the load balancer that turns them into the next
// step's shares. The Python half (python/chorus/data_parallel.py, step.py) calls it in this order
// each step:
//
//   beginForward(arm)      at each forward of the wrapped module (arm: its backward is the last
//                          of the step, so the reducer's hooks launch the buckets)
//   endForward()           when the module's forward returned (the trace's forward span)
//   ... backward: the reducer's hooks launch bucket all-reduces while backward runs ...
//   synchronize()          ends the compute phase (an emulated device releases each held bucket
//                          at its emulated moment, then pads), waits for the reduction and writes
//                          sum / global_batch into every .grad
//   finishStep(...)        all-gathers compute, wait, loss, overflow and samples of every rank;
//                          all ranks feed the same figures to identical balancers
//   endStep(extras)        after the optimizer: under `chorus run --metrics-port/--trace`, the
//                          step's report to the agent and its timeline (step_observer.h)
//
// It mirrors the C++ trainer's step (src/runtime/train/data_parallel_engine.cc) minus what the
// Python side owns (the data, the optimizer, the loss scaler). Training thread only: the thread
// that runs forward and backward (autograd runs a CPU backward on the caller's thread, whose CPU
// clock the emulator reads). Non-copyable.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chorus/core/collective_kinds.h"
#include "chorus/device/speed_emulator.h"
#include "chorus/observe/run_observe.h"
#include "chorus/observe/trace_recorder.h"
#include "chorus/parallel/gradient_reducer.h"
#include "chorus/plan/balancer.h"
#include "chorus/runtime/launch/worker.h"
#include "zero_core.h"

namespace chorus::python {

struct DataParallelOptions {
  // Samples per global step, summed over all ranks (B). REQUIRES: >= world size.
  std::int64_t global_batch = 0;
  // "adaptive" (refit and rebalance whenever it pays), "static" (profile, rebalance once) or
  // "fixed" (keep the initial shares). Default: "adaptive".
  std::string balance = "adaptive";
  // Initial shares, one per rank, each >= 1, summing to global_batch. Default: empty, an equal
  // split (the remainder to the lowest ranks, as DDP).
  std::vector<std::int64_t> shares;
  // Cap of every gradient bucket but the first, MiB (ReducerOptions::bucket_bytes). Default: 25.
  double bucket_cap_mb = 25;
  // Launch bucket all-reduces during backward. Default: true.
  bool overlap = true;
  // The gradient all-reduce over groups of ranks by host and device vendor, as chorus train's
  // comm.algorithm (runtime/train/gradient_path.h): kFlat keeps the buckets on the device where
  // one native collective spans the world (NCCL between GPUs of one vendor), in host memory
  // otherwise; the others bridge unlike groups through host memory. Default: kFlat.
  AllReduceAlgorithm algorithm = AllReduceAlgorithm::kFlat;
  // ZeRO's stage and shards (zero_core.h). Default: stage 0, replicated.
  ZeroOptions zero;
  // What `chorus run --metrics-port/--trace` asks of this rank (read by chorus.init from the
  // environment). Default: nothing.
  observe::ObserveRequest observe;
};

class StepObserver;

// What every rank learns at the end of a step. Value type.
struct StepFigures {
  std::int64_t step = 0;
  double loss = 0;                        // Σ loss sums / global batch (0 when none was given)
  bool overflow = false;                  // some rank saw non-finite gradients
  std::vector<double> compute_seconds;    // per rank, as its emulated device would have taken
  std::vector<double> wait_seconds;       // per rank, blocked in the reduction's finish
  std::vector<std::int64_t> samples;      // per rank, samples it processed this step
  std::vector<std::int64_t> next_shares;  // shares of the coming step
  std::string rebalance;                  // the balancer's explanation when they changed, else ""
};

class DataParallelCore {
 public:
  // Broadcasts nothing: the Python side calls broadcastFromRankZero() next, then, under ZeRO,
  // zero()->start(). Throws ConfigError on bad options; collective (the reducer is built on every
  // rank in the same order).
  DataParallelCore(std::shared_ptr<runtime::Worker> worker, std::vector<at::Tensor> parameters,
                   const DataParallelOptions& options);
  ~DataParallelCore();
  DataParallelCore(const DataParallelCore&) = delete;
  DataParallelCore& operator=(const DataParallelCore&) = delete;

  // Overwrites `tensors` (the module's parameters and buffers) with rank 0's, as DDP does at
  // construction, so that every replica starts from the same model. Collective.
  void broadcastFromRankZero(std::vector<at::Tensor> tensors);

  // A forward of the wrapped module begins: starts the step (the emulator's turn) at its first
  // forward, ends the previous micro-batch's phase and opens a new one. `arm`: this micro-batch's
  // backward is the step's last (not under no_sync()); its hooks then launch the buckets.
  void beginForward(bool arm, std::int64_t samples);
  // Completes the step's gradient reduction (once per step; later calls return at once). Under
  // ZeRO the slice's gradient is then in zero()->gradientSlice() and the parameters have no .grad
  // (stage 3: no bytes either, until the next forward gathers them).
  void synchronize();
  // Whether the reduced gradients are all finite. REQUIRES: synchronize() was called this step.
  bool gradientsFinite() const;
  // Ends the step: all-gathers every rank's figures and feeds them to the balancer (from the
  // second step on: the first pays one-time costs). `samples` < 0: what the forwards counted, or
  // this rank's share when they counted nothing. Throws ConfigError when the ranks' samples do
  // not add up to the global batch. Calls synchronize() first if needed.
  StepFigures finishStep(double loss_sum, bool overflow, std::int64_t samples);
  // The module's forward returned: the trace's forward span ends here, the backward's begins.
  void endForward();
  // The step ended, after the optimizer: sends its report and records the optimizer's span when
  // observed (observing()); nothing otherwise.
  void endStep(double lr, double loss_scale, bool loss_known);
  // Whether `chorus run` asked for metrics or a trace (DataParallelOptions::observe).
  bool observing() const { return observer_ != nullptr; }
  // Elastic recovery's figures for the reports after it (python/chorus/elastic.py).
  void noteRecovery(int generation, double agree_seconds, double rebuild_seconds,
                    const std::vector<int>& lost);
  // Writes the trace's part if it holds spans not written yet (at the process's exit).
  void flushObservation();

  // The shares of the coming step (Σ = global batch) and this rank's.
  const std::vector<std::int64_t>& shares() const { return balancer_->shares(); }
  std::int64_t localShare() const;
  std::int64_t step() const { return step_; }
  std::int64_t globalBatch() const { return options_.global_batch; }
  int rank() const;
  int worldSize() const;
  int numBuckets() const { return reducer_->numBuckets(); }
  // ZeRO's half of the step (null without ZeRO).
  ZeroCore* zero() { return zero_.get(); }

  // For checkpoints: the balancer's state and the step counter.
  plan::BalancerState balancerState() const { return balancer_->exportState(); }
  void restore(const plan::BalancerState& state, std::int64_t step);

  // Elastic recovery (python/chorus/elastic.py). The balancer's state for the next generation
  // when only the ranks `kept` of this core's world (ascending) survive: the lost ranks' samples
  // spread over the survivors in proportion to their shares, what the balancer learnt of the
  // survivors kept (plan/survivors.h). Pure; the source of the next generation computes it and
  // hands it to every member, so that all build the same balancer.
  plan::BalancerState survivorBalancerState(const std::vector<int>& kept) const;
  // After the worker regrouped onto the next generation's world: a new reducer on that world
  // (the old one's hooks removed first), a balancer of the new world size from `state`, the step
  // counter at `step`, and whatever the interrupted step had begun (phase, armed hooks, counts)
  // dropped. Local: no collective. Throws ConfigError under ZeRO (its slices would have to be cut
  // anew: not built) and CheckpointError when `state` does not fit the new world.
  void regroup(const plan::BalancerState& state, std::int64_t step);

 private:
  // Ends the open compute phase: releases held buckets at their emulated moments, pads.
  void endPhase();
  // The reducer's options: the bucket sizes asked for, and the emulated device's held launches.
  parallel::ReducerOptions reducerOptions();
  // Forgets the step in progress (its phase closed without padding).
  void resetStep();
  // Records a span that ends now on the step's timeline, when the step is traced.
  void traceSpan(observe::Track track, const char* name, const char* category,
                 observe::TraceRecorder::Clock::time_point start);

  std::shared_ptr<runtime::Worker> worker_;
  DataParallelOptions options_;
  std::vector<at::Tensor> parameters_;  // the reducer's, kept to build another after a regroup
  std::unique_ptr<plan::LoadBalancer> balancer_;
  std::unique_ptr<ZeroCore> zero_;  // before reducer_: its scatter writes into zero_'s slice
  std::unique_ptr<parallel::GradientReducer> reducer_;
  device::SpeedEmulator& emulator_;
  std::optional<device::SpeedEmulator::ComputeScope> phase_;
  std::vector<double> held_at_;  // computeSoFar() of each bucket held back in the phase
  bool step_open_ = false;       // a forward of this step ran
  bool armed_ = false;           // the reducer was armed this step
  bool synchronized_ = false;    // synchronize() ran this step
  int released_ = 0;             // buckets the reducer released this step (hold_launch calls)
  double compute_seconds_ = 0;   // this step's phases, as the emulated device takes them
  double wait_seconds_ = 0;      // this step's wait in the reducer's finish()
  std::int64_t forward_samples_ = 0;
  std::int64_t step_ = 0;
  std::unique_ptr<StepObserver> observer_;  // null unless `chorus run` asked for it
  observe::TraceRecorder::Clock::time_point forward_start_;
  std::optional<observe::TraceRecorder::Clock::time_point> backward_start_;
};

}  // namespace chorus::python
