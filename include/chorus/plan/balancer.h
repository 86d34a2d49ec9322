// Load balancing for heterogeneous data parallelism: how many samples of each global batch every
// data-parallel rank takes.
//
// Each rank's compute time per step is modelled as t_i(b) = a_i + c_i·b (a fixed cost plus a cost
// per sample), fitted online from measurements by SpeedModel. balanceShares() turns the fitted
// timings into integer shares b_i with Σ b_i = B that minimise the slowest rank's time, and
// LoadBalancer is the policy around it: profile at equal shares, then rebalance only when the
// predicted step time improves enough (hysteresis), and explain every change in one log line.
//
// Only shares change; the global batch does not, so placement never changes the math (DESIGN
// invariant 1). Everything here is deterministic plain C++: every rank runs the same code on the
// same all-gathered timings and arrives at the same shares without another round of agreement
// (this relies on all ranks running the same binary, so that floating point agrees bit for bit).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace chorus::plan {

// The model t(b) = a + c·b of one rank's compute time per step for b samples.
struct RankTiming {
  double a = 0.0;  // fixed seconds per step (kernel launches, optimizer, hooks)
  double c = 0.0;  // seconds per sample

  // Predicted seconds for `samples`; a rank with no samples does no work and costs 0.
  double seconds(int64_t samples) const { return samples > 0 ? a + c * samples : 0.0; }
};

// Online fit of one rank's RankTiming from observations (b, t) of its step compute time.
//
// Keeps a window of the most recent observations, so that it follows a change of speed (thermal
// throttling, a co-located job) within about half a window: once the new regime holds the
// majority of the window the old observations are rejected as outliers. The fit is robust to noise
// and to single slow steps: a Theil–Sen line (median of pairwise slopes), rejection of points whose
// residual exceeds 3× the median absolute residual, then least squares over the inliers. When the
// window's b values are too close together to tell a fixed cost from a per-sample cost (less than
// kMinRelativeSpread apart), the fit assumes a = 0 and takes c as the mean of t/b over the ratios
// that are not outliers by the same rule. The result never has c <= 0 nor a < 0.
//
// Value type, not thread-safe.
class SpeedModel {
 public:
  struct Observation {
    int64_t samples;
    double seconds;
  };
  static constexpr int kDefaultWindow = 16;
  // Smallest c ever reported, so that no rank looks free (it would be handed the whole batch).
  static constexpr double kMinSecondsPerSample = 1e-12;
  // A line is fitted only when max(b) − min(b) >= this fraction of max(b): closer together, noise
  // in t turns into wild slopes and intercepts.
  static constexpr double kMinRelativeSpread = 0.2;
  // An observation this far off the fit (as a fraction of the prediction) counts toward a speed
  // change; two in a row in the same direction restart the window.
  static constexpr double kShiftThreshold = 0.35;

  // `window`: observations kept. REQUIRES: window >= 2 (else ConfigError). Default: 16.
  explicit SpeedModel(int window = kDefaultWindow);

  // Records that `samples` samples took `seconds` of compute, and refits (after forgetting the
  // window when the speed visibly changed, see kShiftThreshold). Observations that
  // carry no information about speed are dropped: samples <= 0 (the rank did no work), or
  // seconds negative or not finite.
  void observe(int64_t samples, double seconds);

  // The current fit. With no observations: {a = 0, c = 1}, a neutral starting value that treats all
  // unobserved ranks alike.
  RankTiming timing() const { return timing_; }
  // The window, oldest first.
  const std::deque<Observation>& observations() const { return observations_; }
  int window() const { return window_; }
  // How far the fit may be off, as a fraction of the predicted time: the robust scatter of the
  // window around the fit (1.4826 × median |t/t̂ − 1|, the Gaussian σ) over √n. 0 with fewer than
  // two observations. The balancer asks a gain to beat this before it trusts it.
  double relativeError() const { return relative_error_; }
  // Forgets every observation.
  void reset();

 private:
  int window_;
  void forgetOnSpeedChange(int64_t samples, double seconds);

  std::deque<Observation> observations_;
  RankTiming timing_;
  double relative_error_ = 0;
  int shift_streak_ = 0;  // signed count of consecutive observations off the fit
};

// Integer shares b_i >= 0 with Σ b_i = global_batch and b_i <= caps[i] (a cap <= 0, or an empty
// `caps`, means no cap) that minimise max_i t_i(b_i), where a rank with b_i = 0 costs 0.
// Continuous water-filling (bisection on the finish time T, b_i(T) = clamp((T − a_i)/c_i, 0,
// cap_i)) followed by integer rounding: floor, then the remaining samples one at a time to the rank
// whose t_i(b_i + 1) is smallest, ties to the lowest rank. The result is optimal among integer
// splits and a pure function of its inputs. Throws ConfigError when the caps cannot hold the batch,
// on negative global_batch, on an empty `timings`, on a timing with a < 0 or c <= 0 or not finite,
// or when caps has the wrong size.
std::vector<int64_t> balanceShares(const std::vector<RankTiming>& timings, int64_t global_batch,
                                   const std::vector<int64_t>& caps = {});

// B split into n equal shares, the remainder going one each to the lowest ranks (what DDP does).
// REQUIRES: n >= 1, B >= 0 (else ConfigError).
std::vector<int64_t> equalShares(int64_t global_batch, int ranks);

// B split in proportion to `speeds` by the largest remainder method (ties to the lowest rank).
// REQUIRES: speeds non-empty, each finite and >= 0, at least one > 0, B >= 0 (else ConfigError).
std::vector<int64_t> proportionalShares(int64_t global_batch, const std::vector<double>& speeds);

// max_i timings[i].seconds(shares[i]): the predicted compute time of a step.
double predictedStepSeconds(const std::vector<RankTiming>& timings,
                            const std::vector<int64_t>& shares);

enum class BalancerMode {
  kOff,       // equal shares forever, as DDP does
  kStatic,    // profile, rebalance once, then keep the shares
  kAdaptive,  // keep refitting and rebalance whenever it pays
};

const char* toString(BalancerMode mode);

struct BalancerOptions {
  // Default: kAdaptive.
  BalancerMode mode = BalancerMode::kAdaptive;
  // Steps run at equal shares before the first fit. REQUIRES: >= 1. Default: 3.
  int profile_steps = 3;
  // Rebalance only when the predicted step time improves by more than this fraction (plus a
  // noise margin, see LoadBalancer), so that noise does not shuffle samples back and forth.
  // REQUIRES: 0 <= min_gain < 1. Default: 0.10 — smaller predicted gains are within what timing
  // noise on a shared host (SMT siblings, co-tenants) makes up, and chasing them makes shares flap.
  double min_gain = 0.10;
  // Steps after a change before the next one may happen, so that the new shares are measured
  // before they are judged. REQUIRES: >= 0. Default: 5.
  int cooldown_steps = 5;
  // Observations per rank kept by its SpeedModel. REQUIRES: >= 2. Default: 16.
  int window = SpeedModel::kDefaultWindow;
  // Where the shares start instead of an equal split: a planner's shares (plan = "auto"), which
  // kStatic / kAdaptive then refine from measurements and kOff keeps. REQUIRES: empty, or one
  // entry >= 0 per rank, within the caps, summing to the global batch. Default: empty (equal).
  std::vector<int64_t> initial_shares;
};

// Everything a LoadBalancer needs to resume where it stopped, as plain vectors for checkpoints.
struct BalancerState {
  std::vector<int64_t> shares;
  // update() calls so far (the profile counts these).
  int64_t steps_observed = 0;
  // Step of the last change of shares; kNever before the first.
  int64_t last_change_step = kNever;
  // kStatic: whether the single fit has been made.
  bool static_done = false;
  // kAdaptive: the step of the pending settling look (see LoadBalancer); kNever when none.
  int64_t settle_step = kNever;
  // The speed models' windows, flattened oldest first: entry k belongs to rank
  // observation_rank[k].
  std::vector<int> observation_rank;
  std::vector<int64_t> observation_samples;
  std::vector<double> observation_seconds;
  std::string last_change;

  static constexpr int64_t kNever = -1;
};

// The balancing policy for one data-parallel group. Every rank owns an identical instance and
// feeds it the same all-gathered compute times, so all ranks change shares at the same step.
//
// Starts at equal shares (clipped to the caps), or at options.initial_shares. kOff keeps them.
// kStatic fits once after profile_steps and applies the result if it gains enough, then never
// changes again. kAdaptive refits every step and changes the shares when the predicted gain is
// enough and at least cooldown_steps have passed since the last change.
//
// "Enough" is min_gain (the dead band) plus two standard errors of the noisiest rank's fit
// (SpeedModel::relativeError), so that noise alone does not move samples. A dead band alone
// leaves the shares wherever a first, rough fit put them as long as that is within min_gain of
// the optimum; so kAdaptive takes one more look ("settling") `window` steps after each change,
// when every rank has a full window measured at the new shares, and then applies the balanced
// shares if they beat the noise term alone. A settling change arms no further look, so each
// regular change brings at most one settling change after it.
//
// Value type, not thread-safe.
class LoadBalancer {
 public:
  using Mode = BalancerMode;

  // `caps[i]` is the most samples rank i can take per step (<= 0 or an empty vector: no cap).
  // Throws ConfigError on invalid options, world_size < 1, global_batch < 1, caps of the wrong
  // size, or caps that cannot hold the batch.
  LoadBalancer(const BalancerOptions& options, int world_size, int64_t global_batch,
               const std::vector<int64_t>& caps = {});

  // "off" | "static" | "adaptive"; anything else is a ConfigError that lists them.
  static Mode parseMode(const std::string& text);

  // The samples each rank takes in the coming step; Σ = global_batch.
  const std::vector<int64_t>& shares() const { return shares_; }

  // Feeds the compute seconds every rank measured for `step` (run at the current shares).
  // Returns true when shares() changed; lastChange() then says why. `step` only needs to
  // increase; the cooldown is counted in steps. Throws ConfigError when compute_seconds does not
  // have world_size entries.
  bool update(int64_t step, const std::vector<double>& compute_seconds);

  // One line for the log about the most recent change, e.g.
  //   step 12: shares 21,21,22 -> 36,18,10: predicted step 0.412 s -> 0.251 s (-39%)
  // Empty before the first change.
  const std::string& lastChange() const { return last_change_; }

  // The current fitted timing of every rank. Ranks never observed borrow the mean of the others.
  std::vector<RankTiming> timings() const;
  // Predicted compute time of a step at `shares` under the current fit.
  double predictedStepSeconds(const std::vector<int64_t>& shares) const;

  const BalancerOptions& options() const { return options_; }
  int worldSize() const { return static_cast<int>(shares_.size()); }
  int64_t globalBatch() const { return global_batch_; }

  BalancerState exportState() const;
  // Restores a state exported by a balancer with the same world size, batch and caps. Throws
  // CheckpointError when the state does not fit them.
  void importState(const BalancerState& state);

 private:
  bool maybeRebalance(int64_t step, bool settling);

  BalancerOptions options_;
  int64_t global_batch_;
  std::vector<int64_t> caps_;
  std::vector<int64_t> shares_;
  std::vector<SpeedModel> models_;
  int64_t steps_observed_ = 0;
  int64_t last_change_step_ = BalancerState::kNever;
  bool static_done_ = false;
  int64_t settle_step_ = BalancerState::kNever;
  std::string last_change_;
};

}  // namespace chorus::plan
