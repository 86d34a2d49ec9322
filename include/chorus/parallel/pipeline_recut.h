// The adaptive cut of a pipeline: when to move layers between stages while training runs.
//
// The start cut (stageCuts, pipeline_layout.h) comes from the devices' nominal speeds. A device
// that slows down (thermal throttling, a neighbour's job, a wrong spec) leaves it unbalanced.
// RecutPolicy watches every rank's measured compute time per step, infers each device's
// effective speed — the seconds the cut's cost model gives the stage's micro-batches on the
// reference device (stageSeconds, summed over the replica's micro-batches) divided by the
// measured seconds — and re-runs the same automatic cut, with the same cost model and memory
// feasibility, at those speeds. It moves only when the predicted step time falls by more than a
// threshold.
//
//   measure   speed(r, s) = Σ_m stageSeconds(cut of s, micro-batch m of share_r) /
//             compute_seconds(r, s), per step;
//             the median of the last `window` steps (the first step after a change not counted)
//   re-plan   every `every` steps, or at once when some rank's median speed drifts more than
//             `threshold` from the speeds the current cut was chosen for (relative to the other
//             ranks': a change of every speed alike moves no cut), and at the first full window
//             after an undo or a reset
//   move      when 1 − predicted(best) / predicted(current) > threshold; back to the cut just
//             left only above 2 × threshold (hysteresis: model error that follows a moved layer
//             must not make the cut flap)
//   noise     every bar above (drift, gain, undo) is raised by twice the relative standard error
//             of the window's medians (from their median absolute deviation): on a noisy host a
//             decision needs a larger effect, on a quiet one the threshold alone counts. A move
//             worth the threshold but not the noise keeps the drift alive: the next window
//             re-plans (a window across a change of speed is the noisiest)
//   check     `window` steps after a move: the measured gain of the step time against the window
//             before it, next to the predicted one. A move that measured worse by more than
//             `threshold` is undone, and its cut is not tried again until the speeds drift (the
//             cost model can misprice a layer: the speed it infers then follows the layer)
//
// Where the cut sits never changes the math: every stage back-propagates sums and the optimizer
// steps each parameter alike wherever it lives (docs/pipeline.md), so a move is a matter of
// speed only. Pure and deterministic: every rank feeds its own instance the same all-gathered
// figures and makes the same decisions without another message.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "chorus/parallel/pipeline_layout.h"

namespace chorus::parallel {

// The policy's knobs. Value type.
struct RecutOptions {
  // Re-plan at least every `every` steps (the speeds drifting re-plans sooner). REQUIRES: >= 1.
  // Default: 20.
  int every = 20;
  // The smallest predicted gain of a move (a fraction of the step time), and the drift of a
  // rank's speed that re-plans early. REQUIRES: in (0, 1). Default: 0.05.
  double threshold = 0.05;
  // Steps whose median speed a decision uses. REQUIRES: >= 1. Default: 5.
  int window = 5;
};

// A move the policy decided. Value type.
struct RecutMove {
  std::int64_t step = 0;  // decided after this step; the new cut runs from the next one
  std::vector<int> from;
  std::vector<int> to;
  // Predicted seconds per step of both cuts at the measured speeds (the cut's cost model:
  // Σ t_s + (M − 1) · max t_s, transfers and synchronization left out).
  double predicted_from = 0;
  double predicted_to = 0;
  // Measured speed of every rank relative to the fastest, rank order.
  std::vector<double> speeds;
  std::string reason;  // "every 20 steps", "rank 1's speed -48% against the others", ...
  // Undoes the previous move, which measured worse than the cut it left; then predicted_* hold
  // the measured step times and speeds is empty.
  bool revert = false;

  double predictedGain() const { return 1.0 - predicted_to / predicted_from; }
  // One log line: "after step 57 (rank 1's speed -48%): cut 3+3 -> 4+2, speeds 1,0.52,
  // predicted step 0.210 s -> 0.160 s (gain 24%)".
  std::string describe() const;
};

// "3+3" for cuts {0, 3, 6}.
std::string describeCut(const std::vector<int>& cuts);

// The decisions of one job's adaptive cut. Every rank owns one and feeds it the same figures.
// Not thread-safe; copyable (a value of its measurements).
class RecutPolicy {
 public:
  // `request`: what the start cut was made from (the profile, the options — schedule, M,
  // checkpointing, replicas — the devices with their memory budgets, the memory model); its
  // partition and speeds are not used. `cuts`: the cut running now. ConfigError on bad options.
  RecutPolicy(CutRequest request, std::vector<int> cuts, RecutOptions options);

  // Feeds step `step`: every rank's compute seconds (rank order, padded forward + backward), the
  // replica shares it ran with, and its step time (the same figure on every rank, e.g. the
  // largest compute + wait). Returns the move to make after this step, if any; the caller moves
  // and then calls moved().
  std::optional<RecutMove> update(std::int64_t step, const std::vector<double>& compute_seconds,
                                  const std::vector<std::int64_t>& shares, double step_seconds);
  // The move returned by update() was made: measurements restart on the new cut.
  void moved(const RecutMove& move);
  // The cut changed without a decision (a checkpoint's cut adopted at resume): measurements
  // restart, no gain is reported.
  void reset(std::vector<int> cuts, std::int64_t step);
  // Once, after the window that follows a move filled: "cut 3+3 -> 4+2 (after step 57): measured
  // step 0.231 s -> 0.168 s (gain 27%; predicted 24%)". Empty otherwise. Call after update().
  std::string takeMeasuredGain();

  const std::vector<int>& cuts() const { return cuts_; }
  // Predicted seconds per step of `cuts` at `speeds` (absolute, rank order) and `shares`.
  double predictedSeconds(const std::vector<int>& cuts, const std::vector<double>& speeds,
                          const std::vector<std::int64_t>& shares) const;

 private:
  // Each rank's median speed over the window; `error`: the largest relative standard error.
  std::vector<double> medianSpeeds(double& error) const;
  std::vector<int> bestCut(const std::vector<double>& speeds,
                           const std::vector<std::int64_t>& shares) const;

  CutRequest request_;
  RecutOptions options_;
  std::vector<int> cuts_;
  std::vector<int> previous_;               // the cut left by the last move (empty: none)
  std::vector<std::vector<int>> failed_;    // cuts undone since the speeds last drifted
  std::int64_t changed_after_ = -1;         // the step after which the cut last changed
  std::int64_t planned_after_ = -1;         // the step after which the policy last re-planned
  std::deque<std::vector<double>> speeds_;  // per step in the window: each rank's speed
  std::deque<double> step_seconds_;         // per step in the window
  std::vector<double> baseline_;            // the speeds the current cut was judged at
  // Set by moved(): what to compare the next window with, and the move to report.
  std::optional<RecutMove> pending_;
  double pending_before_ = 0;
  double pending_before_error_ = 0;
  std::string measured_;
};

}  // namespace chorus::parallel
