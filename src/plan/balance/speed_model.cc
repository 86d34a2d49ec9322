// SpeedModel: a robust online fit of t(b) = a + c·b over a window of observations.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "chorus/core/error.h"
#include "chorus/plan/balancer.h"

namespace chorus::plan {
namespace {

using Points = std::vector<SpeedModel::Observation>;

// Residuals this many times the median absolute residual are outliers: for Gaussian noise the
// median absolute residual is ~0.67σ, so 3× keeps ~2σ and drops a stalled step or the old regime
// after a change of speed.
constexpr double kOutlierFactor = 3.0;
// When most points lie exactly on the line the median absolute residual is 0; this tolerance
// (relative to the typical step time) keeps points that differ only by rounding.
constexpr double kRelativeTolerance = 1e-9;
// The median absolute deviation times this estimates σ for Gaussian noise.
constexpr double kMadToSigma = 1.4826;
// The largest share of a step's time taken for a fixed cost: a line whose intercept is more than
// this of the typical step is not believed, and a remembered fixed cost is used for points at one
// batch size only up to this share of their time. Fixed costs above it are then underrated, which
// overrates the per-sample cost: moves fall short and take a step more, but never overshoot.
constexpr double kMaxFixedShare = 0.5;

double median(std::vector<double> values) {
  const size_t middle = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + middle, values.end());
  const double upper = values[middle];
  if (values.size() % 2 == 1) return upper;
  const double lower = *std::max_element(values.begin(), values.begin() + middle);
  return 0.5 * (lower + upper);
}

// Keeps the points whose |residual| is within kOutlierFactor × the median absolute residual.
Points inliers(const Points& points, const std::vector<double>& residuals, double scale) {
  std::vector<double> absolute;
  for (double residual : residuals) absolute.push_back(std::fabs(residual));
  const double limit =
      std::max(kOutlierFactor * median(absolute), kRelativeTolerance * std::fabs(scale));
  Points kept;
  for (size_t i = 0; i < points.size(); ++i)
    if (absolute[i] <= limit) kept.push_back(points[i]);
  return kept;
}

double typicalSeconds(const Points& points) {
  std::vector<double> seconds;
  for (const auto& point : points) seconds.push_back(point.seconds);
  return median(seconds);
}

bool wideEnough(const Points& points) {
  int64_t low = points.front().samples, high = low;
  for (const auto& point : points) {
    low = std::min(low, point.samples);
    high = std::max(high, point.samples);
  }
  return static_cast<double>(high - low) >= SpeedModel::kMinRelativeSpread * high && high > low;
}

// a = `fixed` (the device's fixed cost as last seen by a line fit, 0 if never) and c = the mean of
// (t − a)/b over the points whose ratio is near the median. Points at one batch size cannot tell a
// fixed cost from a per-sample one, and assuming a = 0 there would make every move from a
// balanced point misjudge the cost of the samples it moves (the balancer would need a move and a
// correction for each change). The median alone would do, but once outliers are gone the mean is
// ~1.7× less noisy for uniform noise, 1.25× for Gaussian, and noise in c is what the balancer's
// noise margin has to absorb.
RankTiming fitProportional(const Points& points, double fixed) {
  for (const auto& point : points) fixed = std::min(fixed, kMaxFixedShare * point.seconds);
  fixed = std::max(0.0, fixed);
  std::vector<double> ratios;
  for (const auto& point : points) ratios.push_back((point.seconds - fixed) / point.samples);
  const double center = median(ratios);
  std::vector<double> residuals;
  for (double ratio : ratios) residuals.push_back(ratio - center);
  const Points kept = inliers(points, residuals, center);
  double mean = 0;
  for (const auto& point : kept) mean += (point.seconds - fixed) / point.samples;
  mean /= kept.size();
  return RankTiming{fixed, std::max(mean, SpeedModel::kMinSecondsPerSample)};
}

// Ordinary least squares, with the intercept clamped at 0 (then c = Σbt / Σb², the least-squares
// line through the origin).
RankTiming fitLeastSquares(const Points& points) {
  double mean_b = 0, mean_t = 0;
  for (const auto& point : points) {
    mean_b += point.samples;
    mean_t += point.seconds;
  }
  mean_b /= points.size();
  mean_t /= points.size();
  double sxx = 0, sxy = 0;
  for (const auto& point : points) {
    sxx += (point.samples - mean_b) * (point.samples - mean_b);
    sxy += (point.samples - mean_b) * (point.seconds - mean_t);
  }
  RankTiming timing{mean_t - (sxy / sxx) * mean_b, sxy / sxx};
  if (timing.a < 0) {
    double sbb = 0, sbt = 0;
    for (const auto& point : points) {
      sbb += static_cast<double>(point.samples) * point.samples;
      sbt += point.samples * point.seconds;
    }
    timing = RankTiming{0.0, sbt / sbb};
  }
  return timing;
}

// The fit, and whether it is a line through points of different batch sizes (whose a is then the
// device's fixed cost as far as the window tells).
std::pair<RankTiming, bool> fit(const Points& points, double fixed) {
  if (!wideEnough(points)) return {fitProportional(points, fixed), false};

  // Theil–Sen start: the median of pairwise slopes ignores up to ~29% of bad points, which least
  // squares would let drag the line (and with it the residuals that decide who is an outlier).
  std::vector<double> slopes;
  for (size_t i = 0; i < points.size(); ++i)
    for (size_t j = i + 1; j < points.size(); ++j)
      if (points[i].samples != points[j].samples)
        slopes.push_back((points[j].seconds - points[i].seconds) /
                         static_cast<double>(points[j].samples - points[i].samples));
  const double slope = median(slopes);
  std::vector<double> offsets;
  for (const auto& point : points) offsets.push_back(point.seconds - slope * point.samples);
  const double intercept = median(offsets);
  std::vector<double> residuals;
  for (double offset : offsets) residuals.push_back(offset - intercept);

  const Points kept = inliers(points, residuals, typicalSeconds(points));
  if (!wideEnough(kept)) return {fitProportional(kept, fixed), false};
  const RankTiming timing = fitLeastSquares(kept);
  // A slope that is not positive, or a fixed cost that dwarfs the per-sample one, means noise
  // (or a co-tenant whose load changes with the shares) swamps the per-sample cost. Such a line
  // tempts the balancer to pile samples on a rank that only looks nearly free, and the next step
  // to take them back: the shares swing. A model that overrates the per-sample cost only slows
  // convergence down, so the points fall back to the proportional model.
  const double typical = typicalSeconds(kept);
  if (!(timing.c > SpeedModel::kMinSecondsPerSample) || timing.a > kMaxFixedShare * typical)
    return {fitProportional(kept, fixed), false};
  return {timing, true};
}

}  // namespace

SpeedModel::SpeedModel(int window) : window_(window), timing_{0.0, 1.0} {
  CHORUS_CHECK_CONFIG(window >= 2, "speed model window must be at least 2, got ", window);
}

void SpeedModel::observe(int64_t samples, double seconds) {
  if (samples <= 0 || !std::isfinite(seconds) || seconds < 0) return;
  speed_changed_ = false;
  if (holdBack(samples, seconds)) return;
  while (observations_.size() > static_cast<size_t>(window_)) observations_.pop_front();
  refit();
}

void SpeedModel::refit() {
  const auto [timing, line] =
      fit(Points(observations_.begin(), observations_.end()), fixed_seconds_);
  timing_ = timing;
  if (line) fixed_seconds_ = timing.a;
  relative_error_ = 0;
  if (observations_.size() < 2) return;
  std::vector<double> deviations;
  for (const Observation& observation : observations_)
    deviations.push_back(std::fabs(observation.seconds / timing_.seconds(observation.samples) - 1));
  relative_error_ =
      kMadToSigma * median(deviations) / std::sqrt(static_cast<double>(observations_.size()));
}

// An observation far off the fit is either a hiccup of the host (one or two slow steps) or the
// first of a new speed (throttling, a co-located job, a test hook). It is held back, so that a
// hiccup never reaches the fit and moves nothing, until kShiftSteps in a row lie off the fit by
// more than kShiftThreshold in the same direction: then the speed changed. Two are not enough: a
// hiccup that lasts two steps is common enough (1% of steps slow: 1 in 10,000 pairs) to move
// shares for no reason. A change of speed stretches the whole cost curve, fixed and per-sample
// parts alike (a slower clock, a shared core), so the older observations are rescaled by the
// median ratio of the new ones rather than forgotten: the fit keeps telling a fixed cost from a
// per-sample one, and the first move after the change already lands near the new balance.
// Returns true when the observation was held back (the fit is unchanged).
bool SpeedModel::holdBack(int64_t samples, double seconds) {
  if (observations_.size() < 3) {
    held_.clear();
    observations_.push_back({samples, seconds});
    return false;
  }
  // Far from every batch size in the window the fit extrapolates, and being off there is news
  // about the curve's shape, not about a hiccup or a new speed (the first steps after a move).
  bool near = false;
  for (const Observation& observation : observations_)
    near = near || std::abs(observation.samples - samples) <= kMinRelativeSpread * samples;
  if (!near) {
    held_.clear();
    observations_.push_back({samples, seconds});
    return false;
  }
  const double ratio = seconds / timing_.seconds(samples);
  const int direction = ratio > 1 + kShiftThreshold ? 1 : ratio < 1 - kShiftThreshold ? -1 : 0;
  if (direction == 0) {
    held_.clear();  // the held observations were a hiccup
    observations_.push_back({samples, seconds});
    return false;
  }
  if (!held_.empty() && (held_.back().ratio > 1) != (direction > 0)) held_.clear();
  held_.push_back({{samples, seconds}, ratio});
  if (static_cast<int>(held_.size()) < kShiftSteps) return true;
  std::vector<double> ratios;
  for (const Held& held : held_) ratios.push_back(held.ratio);
  const double factor = median(ratios);
  for (Observation& observation : observations_) observation.seconds *= factor;
  fixed_seconds_ *= factor;
  speed_changed_ = true;
  for (const Held& held : held_) observations_.push_back(held.observation);
  held_.clear();
  return false;
}

void SpeedModel::restore(std::vector<Observation> observations, std::vector<Held> held,
                         double fixed_seconds) {
  CHORUS_CHECK_CONFIG(observations.size() <= static_cast<size_t>(window_),
                      "speed model: ", observations.size(), " observations for a window of ",
                      window_);
  reset();
  observations_.assign(observations.begin(), observations.end());
  held_ = std::move(held);
  fixed_seconds_ = fixed_seconds;
  if (!observations_.empty()) refit();
}

void SpeedModel::reset() {
  held_.clear();
  speed_changed_ = false;
  fixed_seconds_ = 0;
  observations_.clear();
  relative_error_ = 0;
  timing_ = RankTiming{0.0, 1.0};
}

}  // namespace chorus::plan
