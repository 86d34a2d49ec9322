// SpeedModel: a robust online fit of t(b) = a + c·b over a window of observations.
#include <algorithm>
#include <cmath>
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

// a = 0 and c = the mean of t/b over the ratios near their median. The median alone would do,
// but once outliers are gone the mean is ~1.7× less noisy for uniform noise, 1.25× for Gaussian,
// and noise in c is what the balancer's dead band has to absorb.
RankTiming fitProportional(const Points& points) {
  std::vector<double> ratios;
  for (const auto& point : points) ratios.push_back(point.seconds / point.samples);
  const double center = median(ratios);
  std::vector<double> residuals;
  for (double ratio : ratios) residuals.push_back(ratio - center);
  const Points kept = inliers(points, residuals, center);
  double mean = 0;
  for (const auto& point : kept) mean += point.seconds / point.samples;
  mean /= kept.size();
  return RankTiming{0.0, std::max(mean, SpeedModel::kMinSecondsPerSample)};
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

RankTiming fit(const Points& points) {
  if (!wideEnough(points)) return fitProportional(points);

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
  if (!wideEnough(kept)) return fitProportional(kept);
  const RankTiming timing = fitLeastSquares(kept);
  // A slope that is not positive means noise swamps the per-sample cost; the proportional model
  // at least never tempts the balancer to pile samples on a rank that only looks free.
  if (!(timing.c > SpeedModel::kMinSecondsPerSample)) return fitProportional(kept);
  return timing;
}

}  // namespace

SpeedModel::SpeedModel(int window) : window_(window), timing_{0.0, 1.0} {
  CHORUS_CHECK_CONFIG(window >= 2, "speed model window must be at least 2, got ", window);
}

void SpeedModel::observe(int64_t samples, double seconds) {
  if (samples <= 0 || !std::isfinite(seconds) || seconds < 0) return;
  forgetOnSpeedChange(samples, seconds);
  observations_.push_back({samples, seconds});
  while (observations_.size() > static_cast<size_t>(window_)) observations_.pop_front();
  timing_ = fit(Points(observations_.begin(), observations_.end()));
  relative_error_ = 0;
  if (observations_.size() < 2) return;
  std::vector<double> deviations;
  for (const Observation& observation : observations_)
    deviations.push_back(std::fabs(observation.seconds / timing_.seconds(observation.samples) - 1));
  relative_error_ =
      kMadToSigma * median(deviations) / std::sqrt(static_cast<double>(observations_.size()));
}

// A device whose speed changed (throttling, a co-tenant, a test hook) makes every older
// observation wrong; fitting through old and new would take a full window to notice and could
// overshoot on the way. Two observations in a row off the fit by more than kShiftThreshold, in the
// same direction, mark a change: the window keeps only the observation before this one.
void SpeedModel::forgetOnSpeedChange(int64_t samples, double seconds) {
  if (observations_.size() < 3) {
    shift_streak_ = 0;
    return;
  }
  const double ratio = seconds / timing_.seconds(samples);
  const int direction = ratio > 1 + kShiftThreshold ? 1 : ratio < 1 - kShiftThreshold ? -1 : 0;
  shift_streak_ = direction != 0 && (shift_streak_ == 0 || (shift_streak_ > 0) == (direction > 0))
                      ? shift_streak_ + direction
                      : direction;
  if (std::abs(shift_streak_) < 2) return;
  observations_.erase(observations_.begin(), observations_.end() - 1);
  shift_streak_ = 0;
}

void SpeedModel::reset() {
  shift_streak_ = 0;
  observations_.clear();
  relative_error_ = 0;
  timing_ = RankTiming{0.0, 1.0};
}

}  // namespace chorus::plan
