// Share computation (water-filling, equal, proportional) and the LoadBalancer policy.
#include "chorus/plan/balancer.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <numeric>
#include <sstream>

#include "chorus/core/error.h"
#include "chorus/core/name_table.h"

namespace chorus::plan {
namespace {

// Bisection halves the interval each round; 200 rounds exhaust double precision for any range.
constexpr int kBisectionRounds = 200;
// A change must beat the dead band by this many standard errors of the fit, so that a gain that
// measurement noise alone could produce is not acted on (two: ~98% one-sided confidence).
constexpr double kConfidence = 2.0;
// A gain the fits predict but noise could explain is acted on once the same move has been called
// for this many updates in a row, and then only halfway (a damped move).
constexpr int64_t kPersistentUpdates = 5;
// A rank is left out only when the step without it is predicted this much shorter than with its
// one sample: a margin against flapping in and out at the threshold (it comes back as soon as
// the optimum gives it samples again, so the two thresholds differ by this much).
constexpr double kLeaveOutGain = 0.05;

// Per rank, which way `to` moves from `from`: -1, 0 or +1.
std::vector<int> directionOf(const std::vector<int64_t>& from, const std::vector<int64_t>& to) {
  std::vector<int> direction(from.size());
  for (size_t i = 0; i < from.size(); ++i) direction[i] = (to[i] > from[i]) - (to[i] < from[i]);
  return direction;
}

// Half of each rank's move from `from` to `to`, at least one sample where it moves at all; the
// sum is restored by trimming the largest of the halved moves. Every share stays between its
// `from` and `to` values, so caps and the one-sample floor that both respect still hold.
std::vector<int64_t> halfway(const std::vector<int64_t>& from, const std::vector<int64_t>& to) {
  std::vector<int64_t> result(from.size());
  int64_t surplus = 0;
  for (size_t i = 0; i < from.size(); ++i) {
    const int64_t delta = to[i] - from[i];
    int64_t half = delta / 2;
    if (half == 0 && delta != 0) half = delta > 0 ? 1 : -1;
    result[i] = from[i] + half;
    surplus += half;
  }
  while (surplus != 0) {
    const int64_t sign = surplus > 0 ? 1 : -1;
    size_t largest = from.size();
    for (size_t i = 0; i < from.size(); ++i)
      if ((result[i] - from[i]) * sign > 0 &&
          (largest == from.size() ||
           (result[i] - from[i]) * sign > (result[largest] - from[largest]) * sign))
        largest = i;
    result[largest] -= sign;
    surplus -= sign;
  }
  return result;
}

std::string joinShares(const std::vector<int64_t>& shares) {
  std::ostringstream out;
  for (size_t i = 0; i < shares.size(); ++i) out << (i ? "," : "") << shares[i];
  return out.str();
}

// Rank i's cap as a number of samples that never exceeds the batch (so "no cap" needs no
// special case below).
std::vector<int64_t> effectiveCaps(const std::vector<int64_t>& caps, size_t ranks,
                                   int64_t global_batch) {
  CHORUS_CHECK_CONFIG(caps.empty() || caps.size() == ranks, "got ", caps.size(),
                      " sample caps for ", ranks, " ranks");
  std::vector<int64_t> effective(ranks, global_batch);
  for (size_t i = 0; i < caps.size(); ++i)
    if (caps[i] > 0) effective[i] = std::min(caps[i], global_batch);
  const int64_t room = std::accumulate(effective.begin(), effective.end(), int64_t{0});
  CHORUS_CHECK_CONFIG(room >= global_batch, "the ranks' sample caps (", joinShares(caps),
                      ") hold only ", room, " of the global batch of ", global_batch,
                      " samples; raise the caps or lower the batch");
  return effective;
}

void checkInitialShares(const std::vector<int64_t>& shares, int world_size, int64_t global_batch,
                        const std::vector<int64_t>& caps) {
  CHORUS_CHECK_CONFIG(static_cast<int>(shares.size()) == world_size,
                      "balancer initial shares: ", shares.size(), " shares for ", world_size,
                      " ranks");
  int64_t total = 0;
  for (size_t i = 0; i < shares.size(); ++i) {
    CHORUS_CHECK_CONFIG(shares[i] >= 0, "balancer initial shares: rank ", i, " has ", shares[i]);
    CHORUS_CHECK_CONFIG(caps.empty() || caps[i] <= 0 || shares[i] <= caps[i],
                        "balancer initial shares: rank ", i, " takes ", shares[i],
                        " samples, more than its cap of ", caps[i]);
    total += shares[i];
  }
  CHORUS_CHECK_CONFIG(total == global_batch, "balancer initial shares sum to ", total,
                      ", not to the global batch ", global_batch);
}

}  // namespace

std::vector<int64_t> balanceShares(const std::vector<RankTiming>& timings, int64_t global_batch,
                                   const std::vector<int64_t>& caps) {
  CHORUS_CHECK_CONFIG(!timings.empty(), "cannot balance a batch over zero ranks");
  CHORUS_CHECK_CONFIG(global_batch >= 0, "global batch must not be negative, got ", global_batch);
  for (size_t i = 0; i < timings.size(); ++i)
    CHORUS_CHECK_CONFIG(std::isfinite(timings[i].a) && std::isfinite(timings[i].c) &&
                            timings[i].a >= 0 && timings[i].c > 0,
                        "rank ", i, " has an invalid timing a = ", timings[i].a,
                        " s, c = ", timings[i].c, " s/sample (need a >= 0, c > 0)");
  const size_t ranks = timings.size();
  const std::vector<int64_t> cap = effectiveCaps(caps, ranks, global_batch);
  std::vector<int64_t> shares(ranks, 0);
  if (global_batch == 0) return shares;

  // The most (continuous) samples rank i finishes within `finish` seconds.
  const auto capacity = [&](double finish, size_t i) {
    if (finish <= timings[i].a) return 0.0;
    return std::min((finish - timings[i].a) / timings[i].c, static_cast<double>(cap[i]));
  };
  const auto total = [&](double finish) {
    double sum = 0;
    for (size_t i = 0; i < ranks; ++i) sum += capacity(finish, i);
    return sum;
  };
  // Invariant: total(low) < B <= total(high). Every rank at its cap holds the batch (checked by
  // effectiveCaps), so the slowest capped rank's time is a valid upper end.
  double low = 0, high = 0;
  for (size_t i = 0; i < ranks; ++i) high = std::max(high, timings[i].seconds(cap[i]));
  const double batch = static_cast<double>(global_batch);
  for (int round = 0; round < kBisectionRounds; ++round) {
    const double middle = low + (high - low) / 2;
    if (middle <= low || middle >= high) break;
    (total(middle) >= batch ? high : low) = middle;
  }

  // Everything a rank can finish by `low` is below the integer optimum (which is >= the
  // continuous one), so flooring there never overshoots; the greedy top-up then takes the
  // cheapest next samples in order, which is exactly the integer optimum.
  int64_t assigned = 0;
  for (size_t i = 0; i < ranks; ++i) {
    shares[i] = std::min(static_cast<int64_t>(std::floor(capacity(low, i))), cap[i]);
    assigned += shares[i];
  }
  while (assigned < global_batch) {
    size_t best = ranks;
    double best_seconds = 0;
    for (size_t i = 0; i < ranks; ++i) {
      if (shares[i] >= cap[i]) continue;
      const double seconds = timings[i].seconds(shares[i] + 1);
      if (best == ranks || seconds < best_seconds) {
        best = i;
        best_seconds = seconds;
      }
    }
    ++shares[best];
    ++assigned;
  }
  return shares;
}

std::vector<int64_t> equalShares(int64_t global_batch, int ranks) {
  CHORUS_CHECK_CONFIG(ranks >= 1, "cannot split a batch over ", ranks, " ranks");
  CHORUS_CHECK_CONFIG(global_batch >= 0, "global batch must not be negative, got ", global_batch);
  std::vector<int64_t> shares(ranks, global_batch / ranks);
  for (int64_t i = 0; i < global_batch % ranks; ++i) ++shares[i];
  return shares;
}

std::vector<int64_t> proportionalShares(int64_t global_batch, const std::vector<double>& speeds) {
  CHORUS_CHECK_CONFIG(!speeds.empty(), "cannot split a batch over zero ranks");
  CHORUS_CHECK_CONFIG(global_batch >= 0, "global batch must not be negative, got ", global_batch);
  double sum = 0;
  for (double speed : speeds) {
    CHORUS_CHECK_CONFIG(std::isfinite(speed) && speed >= 0,
                        "speeds must be finite and non-negative, got ", speed);
    sum += speed;
  }
  CHORUS_CHECK_CONFIG(sum > 0, "at least one speed must be positive");

  std::vector<int64_t> shares(speeds.size());
  std::vector<double> remainders(speeds.size());
  int64_t assigned = 0;
  for (size_t i = 0; i < speeds.size(); ++i) {
    const double exact = static_cast<double>(global_batch) * speeds[i] / sum;
    shares[i] = std::min(static_cast<int64_t>(std::floor(exact)), global_batch - assigned);
    remainders[i] = exact - static_cast<double>(shares[i]);
    assigned += shares[i];
  }
  std::vector<size_t> order(speeds.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return remainders[x] > remainders[y]; });
  for (size_t k = 0; assigned < global_batch; k = (k + 1) % order.size()) {
    ++shares[order[k]];
    ++assigned;
  }
  return shares;
}

double predictedStepSeconds(const std::vector<RankTiming>& timings,
                            const std::vector<int64_t>& shares) {
  CHORUS_CHECK_CONFIG(timings.size() == shares.size(), "got ", shares.size(), " shares for ",
                      timings.size(), " ranks");
  double slowest = 0;
  for (size_t i = 0; i < shares.size(); ++i)
    slowest = std::max(slowest, timings[i].seconds(shares[i]));
  return slowest;
}

const char* toString(BalancerMode mode) {
  static constexpr NamedValue<BalancerMode> kNames[] = {{BalancerMode::kOff, "off"},
                                                        {BalancerMode::kStatic, "static"},
                                                        {BalancerMode::kAdaptive, "adaptive"}};
  return nameOf(kNames, mode);
}

LoadBalancer::LoadBalancer(const BalancerOptions& options, int world_size, int64_t global_batch,
                           const std::vector<int64_t>& caps)
    : options_(options), global_batch_(global_batch), caps_(caps) {
  CHORUS_CHECK_CONFIG(world_size >= 1, "load balancer needs at least one rank, got ", world_size);
  CHORUS_CHECK_CONFIG(global_batch >= 1, "global batch must be positive, got ", global_batch);
  CHORUS_CHECK_CONFIG(options.profile_steps >= 1, "balancer profile_steps must be >= 1, got ",
                      options.profile_steps);
  CHORUS_CHECK_CONFIG(options.min_gain >= 0 && options.min_gain < 1,
                      "balancer min_gain must be in [0, 1), got ", options.min_gain);
  CHORUS_CHECK_CONFIG(options.cooldown_steps >= 0, "balancer cooldown_steps must be >= 0, got ",
                      options.cooldown_steps);
  models_.assign(world_size, SpeedModel(options.window));
  // Equal speeds make water-filling an equal split clipped to the caps, remainder to the lowest
  // ranks: DDP's split wherever the caps allow it.
  shares_ =
      balanceShares(std::vector<RankTiming>(world_size, RankTiming{0.0, 1.0}), global_batch, caps);
  if (!options.initial_shares.empty()) {
    checkInitialShares(options.initial_shares, world_size, global_batch, caps_);
    shares_ = options.initial_shares;
  }
}

LoadBalancer::Mode LoadBalancer::parseMode(const std::string& text) {
  for (Mode mode : {Mode::kOff, Mode::kStatic, Mode::kAdaptive})
    if (text == toString(mode)) return mode;
  CHORUS_THROW(ConfigError, "unknown balance mode '", text,
               "'; expected 'off', 'static' or 'adaptive'");
}

bool LoadBalancer::update(int64_t step, const std::vector<double>& compute_seconds) {
  return update(step, compute_seconds, std::vector<int64_t>(shares_));
}

bool LoadBalancer::update(int64_t step, const std::vector<double>& compute_seconds,
                          const std::vector<int64_t>& samples) {
  CHORUS_CHECK_CONFIG(compute_seconds.size() == shares_.size(), "got ", compute_seconds.size(),
                      " compute times for ", shares_.size(), " ranks");
  CHORUS_CHECK_CONFIG(samples.size() == shares_.size(), "got ", samples.size(),
                      " sample counts for ", shares_.size(), " ranks");
  for (size_t i = 0; i < shares_.size(); ++i) models_[i].observe(samples[i], compute_seconds[i]);
  ++steps_observed_;
  if (steps_observed_ < options_.profile_steps) return false;
  switch (options_.mode) {
    case Mode::kOff:
      return false;
    case Mode::kStatic:
      if (static_done_) return false;
      static_done_ = true;
      return maybeRebalance(step);
    case Mode::kAdaptive: {
      // A confirmed change of a rank's speed ends the cooldown: the shares it calls for are
      // worth more than measuring the last move longer.
      bool speed_changed = false;
      for (const SpeedModel& model : models_) speed_changed = speed_changed || model.speedChanged();
      if (!speed_changed && last_change_step_ != BalancerState::kNever &&
          step - last_change_step_ < options_.cooldown_steps)
        return false;
      return maybeRebalance(step);
    }
  }
  return false;
}

namespace {

// The ranks in `floored` keep at least one sample when the batch allows it: a rank at zero is
// never measured again, so a rank that was slow during a noisy moment must not be starved on the
// word of noise. Giving each floored rank its first sample up front and balancing the rest on
// t_i(1 + x) = (a_i + c_i) + c_i x solves exactly the problem with b_i >= 1 for those ranks
// (b_i >= 0 for the others).
std::vector<int64_t> balanceWithFloor(const std::vector<RankTiming>& fitted, int64_t global_batch,
                                      const std::vector<int64_t>& caps,
                                      const std::vector<bool>& floored) {
  const int64_t count = std::count(floored.begin(), floored.end(), true);
  // A cap of exactly 1 leaves no room after the first sample, and "0" means "no cap" in
  // balanceShares, so such a job is balanced without the floor.
  bool tight_cap = false;
  for (size_t i = 0; i < caps.size(); ++i) tight_cap = tight_cap || (floored[i] && caps[i] == 1);
  if (global_batch < count || tight_cap || count == 0)
    return balanceShares(fitted, global_batch, caps);
  std::vector<RankTiming> shifted = fitted;
  std::vector<int64_t> rest_caps = caps;
  for (size_t i = 0; i < fitted.size(); ++i) {
    if (!floored[i]) continue;
    shifted[i].a += shifted[i].c;
    if (!rest_caps.empty() && rest_caps[i] > 0) --rest_caps[i];
  }
  std::vector<int64_t> shares = balanceShares(shifted, global_batch - count, rest_caps);
  for (size_t i = 0; i < shares.size(); ++i) shares[i] += floored[i] ? 1 : 0;
  return shares;
}

// How a rank is named in the balancer's log lines.
std::string rankName(const BalancerOptions& options, size_t rank) {
  if (rank < options.rank_names.size() && !options.rank_names[rank].empty())
    return options.rank_names[rank];
  return detail::concat("rank ", rank);
}

std::string milliseconds(double seconds) {
  std::ostringstream text;
  text << std::setprecision(3) << seconds * 1e3 << " ms";
  return text.str();
}

}  // namespace

std::vector<int64_t> LoadBalancer::proposeShares(const std::vector<RankTiming>& fitted,
                                                 std::string& why) const {
  // Ranks that have samples keep one (see balanceWithFloor); a rank left out earlier may come
  // back whenever the optimum without it in the floor gives it samples again.
  std::vector<bool> floored(shares_.size());
  for (size_t i = 0; i < shares_.size(); ++i)
    floored[i] = shares_[i] > 0 || models_[i].observations().empty();
  std::vector<int64_t> proposal = balanceWithFloor(fitted, global_batch_, caps_, floored);
  for (size_t i = 0; i < shares_.size(); ++i)
    if (shares_[i] == 0 && proposal[i] > 0)
      why += detail::concat("; ", rankName(options_, i), " back in: its ",
                            milliseconds(fitted[i].seconds(proposal[i])), " for ", proposal[i],
                            " sample", proposal[i] > 1 ? "s" : "", " fit the step");
  if (!options_.leave_out) return proposal;
  // A rank whose single sample takes clearly longer than the step the others manage without it
  // only slows every step down: it is left out (share 0), as long as that stays true.
  const std::vector<int64_t> free = balanceShares(fitted, global_batch_, caps_);
  const double with_floor = plan::predictedStepSeconds(fitted, proposal);
  const double without = plan::predictedStepSeconds(fitted, free);
  std::string left;
  for (size_t i = 0; i < shares_.size(); ++i)
    if (free[i] == 0 && proposal[i] > 0 && !models_[i].observations().empty())
      left += detail::concat("; ", rankName(options_, i), " left out: its one sample takes ",
                             milliseconds(fitted[i].seconds(1)), " against the step's ",
                             milliseconds(without));
  if (left.empty() || without >= with_floor * (1.0 - kLeaveOutGain)) return proposal;
  why = left;
  return free;
}

bool LoadBalancer::maybeRebalance(int64_t step) {
  const std::vector<RankTiming> fitted = timings();
  std::string membership;
  std::vector<int64_t> proposal = proposeShares(fitted, membership);
  if (proposal == shares_) return false;
  const double now = plan::predictedStepSeconds(fitted, shares_);
  const double next = plan::predictedStepSeconds(fitted, proposal);
  double error = 0;
  for (const SpeedModel& model : models_) error = std::max(error, model.relativeError());
  std::string why;
  if (next < now * (1.0 - options_.min_gain - kConfidence * error)) {
    small_gain_updates_ = 0;
  } else if (next < now * (1.0 - options_.min_gain)) {
    // Within the noise margin. A margin that must be beaten at every look would be a dead band
    // as wide as the noise (3-5% of the step with an emulated slow device on a shared host);
    // a move that the fits keep calling for is real, so it is made, halfway.
    const std::vector<int> direction = directionOf(shares_, proposal);
    small_gain_updates_ = direction == small_gain_direction_ ? small_gain_updates_ + 1 : 1;
    small_gain_direction_ = direction;
    if (small_gain_updates_ < kPersistentUpdates) return false;
    small_gain_updates_ = 0;
    why = detail::concat(" (a gain within the noise, called for ", kPersistentUpdates,
                         " updates in a row: half the move)");
    const std::vector<int64_t> half = halfway(shares_, proposal);
    // Half a move that leaves a rank out would keep it in; half of one that brings it back
    // does bring it back (at least one sample moves).
    for (size_t i = 0; i < half.size(); ++i)
      if (proposal[i] == 0 && half[i] > 0) membership.clear();
    proposal = half;
  } else {
    small_gain_updates_ = 0;
    return false;
  }
  const double moved = plan::predictedStepSeconds(fitted, proposal);

  std::ostringstream line;
  line << "step " << step << ": shares " << joinShares(shares_) << " -> " << joinShares(proposal)
       << ": predicted step " << std::setprecision(3) << now << " s -> " << moved << " s ("
       << "-" << std::lround(100.0 * (now - moved) / now) << "%)" << why << membership;
  last_change_ = line.str();
  shares_ = std::move(proposal);
  last_change_step_ = step;
  return true;
}

std::vector<RankTiming> LoadBalancer::timings() const {
  std::vector<RankTiming> fitted;
  RankTiming sum;
  int observed = 0;
  for (const SpeedModel& model : models_) {
    fitted.push_back(model.timing());
    if (!model.observations().empty()) {
      sum.a += model.timing().a;
      sum.c += model.timing().c;
      ++observed;
    }
  }
  if (observed > 0) {
    // A rank that never had samples has no measurements; assuming it average keeps it in play
    // without favouring it.
    const RankTiming mean{sum.a / observed, sum.c / observed};
    for (size_t i = 0; i < models_.size(); ++i)
      if (models_[i].observations().empty()) fitted[i] = mean;
  }
  return fitted;
}

double LoadBalancer::predictedStepSeconds(const std::vector<int64_t>& shares) const {
  return plan::predictedStepSeconds(timings(), shares);
}

bool LoadBalancer::setCaps(const std::vector<int64_t>& caps) {
  effectiveCaps(caps, shares_.size(), global_batch_);  // throws when they cannot hold the batch
  caps_ = caps;
  bool over = false;
  for (size_t i = 0; i < caps_.size(); ++i) over = over || (caps_[i] > 0 && shares_[i] > caps_[i]);
  if (!over) return false;
  std::vector<bool> floored(shares_.size());
  for (size_t i = 0; i < shares_.size(); ++i) floored[i] = shares_[i] > 0;
  std::vector<int64_t> proposal = balanceWithFloor(timings(), global_batch_, caps_, floored);
  std::ostringstream line;
  line << "caps " << joinShares(caps_) << ": shares " << joinShares(shares_) << " -> "
       << joinShares(proposal);
  last_change_ = line.str();
  shares_ = std::move(proposal);
  return true;
}

BalancerState LoadBalancer::exportState() const {
  BalancerState state;
  state.shares = shares_;
  state.steps_observed = steps_observed_;
  state.last_change_step = last_change_step_;
  state.static_done = static_done_;
  state.last_change = last_change_;
  state.small_gain_updates = small_gain_updates_;
  state.small_gain_direction = small_gain_direction_;
  for (size_t rank = 0; rank < models_.size(); ++rank) {
    for (const SpeedModel::Observation& observation : models_[rank].observations()) {
      state.observation_rank.push_back(static_cast<int>(rank));
      state.observation_samples.push_back(observation.samples);
      state.observation_seconds.push_back(observation.seconds);
    }
    for (const SpeedModel::Held& held : models_[rank].held()) {
      state.held_rank.push_back(static_cast<int>(rank));
      state.held_samples.push_back(held.observation.samples);
      state.held_seconds.push_back(held.observation.seconds);
      state.held_ratio.push_back(held.ratio);
    }
    state.fixed_seconds.push_back(models_[rank].fixedSeconds());
  }
  return state;
}

void LoadBalancer::importState(const BalancerState& state) {
  const auto fail = [&](const std::string& why) {
    CHORUS_THROW(CheckpointError, "load balancer state does not fit this job: ", why);
  };
  if (state.shares.size() != shares_.size())
    fail(detail::concat(state.shares.size(), " shares for ", shares_.size(), " ranks"));
  int64_t sum = 0;
  for (size_t i = 0; i < state.shares.size(); ++i) {
    const bool capped = i < caps_.size() && caps_[i] > 0;
    if (state.shares[i] < 0 || (capped && state.shares[i] > caps_[i]))
      fail(detail::concat("rank ", i, "'s share ", state.shares[i], " is outside its limits"));
    sum += state.shares[i];
  }
  if (sum != global_batch_)
    fail(detail::concat("shares sum to ", sum, ", not the global batch ", global_batch_));
  const size_t count = state.observation_rank.size();
  if (state.observation_samples.size() != count || state.observation_seconds.size() != count)
    fail("observation vectors differ in length");
  const size_t held = state.held_rank.size();
  if (state.held_samples.size() != held || state.held_seconds.size() != held ||
      state.held_ratio.size() != held)
    fail("held observation vectors differ in length");
  if (!state.small_gain_direction.empty() && state.small_gain_direction.size() != models_.size())
    fail(detail::concat(state.small_gain_direction.size(), " move directions for ", models_.size(),
                        " ranks"));
  if (!state.fixed_seconds.empty() && state.fixed_seconds.size() != models_.size())
    fail(detail::concat(state.fixed_seconds.size(), " fixed costs for ", models_.size(), " ranks"));
  for (const std::vector<int>* ranks : {&state.observation_rank, &state.held_rank})
    for (int rank : *ranks)
      if (rank < 0 || static_cast<size_t>(rank) >= models_.size())
        fail(detail::concat("observation for rank ", rank));

  std::vector<std::vector<SpeedModel::Observation>> windows(models_.size());
  std::vector<std::vector<SpeedModel::Held>> held_back(models_.size());
  for (size_t k = 0; k < count; ++k)
    windows[state.observation_rank[k]].push_back(
        {state.observation_samples[k], state.observation_seconds[k]});
  for (size_t k = 0; k < held; ++k)
    held_back[state.held_rank[k]].push_back(
        {{state.held_samples[k], state.held_seconds[k]}, state.held_ratio[k]});
  for (size_t rank = 0; rank < models_.size(); ++rank) {
    if (windows[rank].size() > static_cast<size_t>(models_[rank].window()))
      fail(detail::concat("rank ", rank, " has ", windows[rank].size(),
                          " observations for a window of ", models_[rank].window()));
    const double fixed = state.fixed_seconds.empty() ? 0.0 : state.fixed_seconds[rank];
    models_[rank].restore(std::move(windows[rank]), std::move(held_back[rank]), fixed);
  }
  shares_ = state.shares;
  steps_observed_ = state.steps_observed;
  last_change_step_ = state.last_change_step;
  static_done_ = state.static_done;
  last_change_ = state.last_change;
  small_gain_updates_ = state.small_gain_updates;
  small_gain_direction_ = state.small_gain_direction;
}

}  // namespace chorus::plan
