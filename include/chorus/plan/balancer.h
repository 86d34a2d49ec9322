// Load balancing for heterogeneous data parallelism: how many samples of each global batch every
// data-parallel rank takes.
//
// Each rank's compute time per step is modelled as t_i(b) = a_i + c_i·b (a fixed cost plus a cost
// per sample), fitted online from measurements by SpeedModel. balanceShares() turns the fitted
// timings into integer shares b_i with Σ b_i = B that minimise the slowest rank's time, and
// LoadBalancer is the policy around it: profile at equal shares, then rebalance whenever the
// predicted step time improves by more than the fits' noise, and explain every change in one log
// line. Its claims are tested on simulated devices
// (tests/plan/balance/balancer_simulation_test.cc).
//
// Only shares change; the global batch does not, so placement never changes the math (invariant
// 1, docs/architecture.md, "Invariants"). Everything here is deterministic plain C++: every rank
// runs the same code on the same all-gathered timings and arrives at the same shares without
// another round of agreement (this relies on all ranks running the same binary, so that floating
// point agrees bit for bit).
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
// Keeps a window of the most recent observations. The fit is robust to noise: a Theil–Sen line
// (median of pairwise slopes), rejection of points whose residual exceeds 3× the median absolute
// residual, then least squares over the inliers; a line whose fixed cost is more than half the
// typical step is not believed. When the window's b values are too close together to tell a fixed
// cost from a per-sample cost (less than kMinRelativeSpread apart), the fit keeps the fixed cost
// the last line found (0 before any) and takes c as the mean of (t − a)/b over the points that are
// not outliers by the same rule. The result never has c <= 0 nor a < 0.
//
// Slow steps and changes of speed: an observation more than kShiftThreshold off the fit, near a
// batch size the window has seen, is held back. A host hiccup (one or two slow steps) thus never
// reaches the fit; kShiftSteps in a row off in one direction are a change of speed (throttling, a
// co-located job), and the window is rescaled to it at once (see speedChanged()).
//
// Value type, not thread-safe.
class SpeedModel {
 public:
  struct Observation {
    int64_t samples;
    double seconds;
  };
  // An observation held back from the window, with its ratio to the fit when it came.
  struct Held {
    Observation observation;
    double ratio;
  };
  static constexpr int kDefaultWindow = 16;
  // Smallest c ever reported, so that no rank looks free (it would be handed the whole batch).
  static constexpr double kMinSecondsPerSample = 1e-12;
  // A line is fitted only when max(b) − min(b) >= this fraction of max(b): closer together, noise
  // in t turns into wild slopes and intercepts.
  static constexpr double kMinRelativeSpread = 0.1;
  // An observation this far off the fit (as a fraction of the prediction) counts toward a speed
  // change; kShiftSteps in a row in the same direction rescale the window to the new speed.
  static constexpr double kShiftThreshold = 0.25;
  static constexpr int kShiftSteps = 3;

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
  // Whether the latest observation confirmed a change of speed (the window was rescaled to it).
  bool speedChanged() const { return speed_changed_; }
  // Forgets every observation.
  void reset();

  // Everything needed to continue exactly where this model stands (for checkpoints): the window,
  // the held observations and the remembered fixed cost. restore() refits from them without
  // judging them again. REQUIRES: at most window() observations.
  const std::vector<Held>& held() const { return held_; }
  double fixedSeconds() const { return fixed_seconds_; }
  void restore(std::vector<Observation> observations, std::vector<Held> held, double fixed_seconds);

 private:
  int window_;
  bool holdBack(int64_t samples, double seconds);
  void refit();

  std::deque<Observation> observations_;
  RankTiming timing_;
  double relative_error_ = 0;
  // The fixed cost a of the last fit that was a line through several batch sizes (0 before):
  // used when the window holds one batch size only. See fitProportional in speed_model.cc.
  double fixed_seconds_ = 0;
  bool speed_changed_ = false;
  // The latest consecutive observations off the fit in one direction (see holdBack).
  std::vector<Held> held_;
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
  // A dead band: rebalance only when the predicted step time improves by more than this fraction
  // plus the noise margin (see LoadBalancer). REQUIRES: 0 <= min_gain < 1. Default: 0 — the noise
  // margin alone keeps noise from shuffling samples, and shrinks as the fits firm up, so the
  // shares converge to the optimum instead of stopping anywhere within the band.
  double min_gain = 0.0;
  // Steps after a change before the next one may happen, so that the new shares are measured
  // (twice, so that one slow step cannot decide alone) before they are judged; a confirmed change
  // of a rank's speed ends it early. REQUIRES: >= 0. Default: 2.
  int cooldown_steps = 2;
  // Observations per rank kept by its SpeedModel. REQUIRES: >= 2. Default: 16.
  int window = SpeedModel::kDefaultWindow;
  // Where the shares start instead of an equal split: a planner's shares (plan = "auto"), which
  // kStatic / kAdaptive then refine from measurements and kOff keeps. REQUIRES: empty, or one
  // entry >= 0 per rank, within the caps, summing to the global batch. Default: empty (equal).
  std::vector<int64_t> initial_shares;
  // Whether a rank may be left out (share 0) when even its one sample would make it the
  // straggler: when the step the others manage without it is predicted at least 5% shorter than
  // with its one sample. It is brought back as soon as the fits give it samples again (the
  // others slowed down). A rank never measured is never left out. Default: true.
  bool leave_out = true;
  // How the log lines name each rank ("cpu@0.01"); empty or missing entries: "rank i".
  // Default: empty.
  std::vector<std::string> rank_names;
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
  // The speed models' windows, flattened oldest first: entry k belongs to rank
  // observation_rank[k].
  std::vector<int> observation_rank;
  std::vector<int64_t> observation_samples;
  std::vector<double> observation_seconds;
  // Observations held back from the windows (a hiccup or a change of speed being told apart),
  // flattened like the windows; and each rank's remembered fixed cost (SpeedModel). Empty in
  // states written before they existed: then nothing is held and no fixed cost is remembered.
  std::vector<int> held_rank;
  std::vector<int64_t> held_samples;
  std::vector<double> held_seconds;
  std::vector<double> held_ratio;
  std::vector<double> fixed_seconds;
  std::string last_change;
  // A move within the noise margin: how many updates in a row have called for it, and which way
  // it moves each rank (-1, 0, +1; empty when none). 0 and empty in older states.
  int64_t small_gain_updates = 0;
  std::vector<int> small_gain_direction;

  static constexpr int64_t kNever = -1;
};

// The balancing policy for one data-parallel group. Every rank owns an identical instance and
// feeds it the same all-gathered compute times, so all ranks change shares at the same step.
//
// Starts at equal shares (clipped to the caps), or at options.initial_shares. kOff keeps them.
// kStatic fits once after profile_steps and applies the result if it gains enough, then never
// changes again. kAdaptive refits every step and changes the shares when the predicted gain is
// enough and at least cooldown_steps have passed since the last change (or a rank's speed
// changed). Every rank keeps at least one sample when the batch allows, so none stops being
// measured, except one that options.leave_out lets go: a rank whose single sample takes clearly
// longer than the whole step of the others (a CPU beside a GPU) is left out with share 0 and a
// log line that says why, keeps its last fit, and comes back when that fit says it would
// shorten the step (the others slowed down).
//
// "Enough" is min_gain (a dead band, 0 by default) plus two standard errors of the noisiest
// rank's fit (SpeedModel::relativeError): noise alone rarely moves samples, and when it does the
// move is as small as the noise. There is no permanent dead band: a gain above min_gain but
// within the noise margin is acted on when the same move (the same direction for every rank) has
// been called for 5 updates in a row, and then halfway, so the shares converge to the optimum of
// the fitted curves rather than stopping anywhere within a band of it (the first version's
// policy left up to 10% of the step on the table for good; the noise margin alone, measured with
// an emulated device at 0.077 of a core, 3-5%).
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
  // The same for a step whose ranks ran `samples` instead of the current shares: each rank's fit
  // observes (samples[i], compute_seconds[i]). Why: a Python DataLoader that reads its batch
  // sampler ahead (workers with prefetch) runs a step at the shares of an earlier one. Throws
  // ConfigError when samples does not have world_size entries.
  bool update(int64_t step, const std::vector<double>& compute_seconds,
              const std::vector<int64_t>& samples);

  // One line for the log about the most recent change, e.g.
  //   step 12: shares 21,21,22 -> 36,18,10: predicted step 0.412 s -> 0.251 s (-39%)
  // Empty before the first change.
  const std::string& lastChange() const { return last_change_; }

  // The current fitted timing of every rank. Ranks never observed borrow the mean of the others.
  std::vector<RankTiming> timings() const;
  // Changes the caps, e.g. when a device turned out to hold fewer samples than it was given
  // (same meaning as the constructor's). Shares above a new cap are clipped at once, and the
  // whole split is balanced again under the current fit; lastChange() says so. Returns true when
  // the shares changed. Throws ConfigError on caps of the wrong size or that cannot hold the
  // batch (the balancer is then unchanged).
  bool setCaps(const std::vector<int64_t>& caps);
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
  bool maybeRebalance(int64_t step);
  // The shares the fits `fitted` (timings()) call for, ranks left out or brought back included;
  // appends to `why` what changes in who takes part.
  std::vector<int64_t> proposeShares(const std::vector<RankTiming>& fitted, std::string& why) const;

  BalancerOptions options_;
  int64_t global_batch_;
  std::vector<int64_t> caps_;
  std::vector<int64_t> shares_;
  std::vector<SpeedModel> models_;
  int64_t steps_observed_ = 0;
  int64_t last_change_step_ = BalancerState::kNever;
  bool static_done_ = false;
  std::string last_change_;
  // See BalancerState::small_gain_updates.
  int64_t small_gain_updates_ = 0;
  std::vector<int> small_gain_direction_;
};

}  // namespace chorus::plan
