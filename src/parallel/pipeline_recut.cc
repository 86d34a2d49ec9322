#include "chorus/parallel/pipeline_recut.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "chorus/core/error.h"

namespace chorus::parallel {
namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// The standard error of the median of `values`, relative to it: 1.2533 σ / √n, σ estimated as
// 1.4826 × the median absolute deviation, which one descheduled step does not inflate.
double medianError(const std::vector<double>& values) {
  const double middle = median(values);
  std::vector<double> deviations;
  for (double value : values) deviations.push_back(std::fabs(value - middle));
  const double sigma = 1.4826 * median(deviations);
  return middle > 0 ? 1.2533 * sigma / std::sqrt(static_cast<double>(values.size())) / middle : 0;
}

std::string fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

std::string percent(double fraction) {
  char text[32];
  std::snprintf(text, sizeof text, "%.0f%%", 100.0 * fraction);
  return text;
}

// `speeds` divided by their largest.
std::vector<double> relative(const std::vector<double>& speeds) {
  const double top = *std::max_element(speeds.begin(), speeds.end());
  std::vector<double> out;
  for (double speed : speeds) out.push_back(speed / top);
  return out;
}

}  // namespace

std::string describeCut(const std::vector<int>& cuts) {
  std::ostringstream text;
  for (std::size_t s = 0; s + 1 < cuts.size(); ++s) text << (s ? "+" : "") << cuts[s + 1] - cuts[s];
  return text.str();
}

std::string RecutMove::describe() const {
  std::ostringstream text;
  text << "after step " << step << " (" << reason << "): cut " << describeCut(from) << " -> "
       << describeCut(to);
  if (revert) {
    text << ", measured step " << fixed(predicted_from, 3) << " s against "
         << fixed(predicted_to, 3) << " s before";
    return text.str();
  }
  text << ", speeds";
  for (std::size_t k = 0; k < speeds.size(); ++k) text << (k ? "," : " ") << fixed(speeds[k], 2);
  text << ", predicted step " << fixed(predicted_from, 3) << " s -> " << fixed(predicted_to, 3)
       << " s (gain " << percent(predictedGain()) << ")";
  return text.str();
}

RecutPolicy::RecutPolicy(CutRequest request, std::vector<int> cuts, RecutOptions options)
    : request_(std::move(request)), options_(options), cuts_(std::move(cuts)) {
  CHORUS_CHECK_CONFIG(options_.every >= 1, "recut: every must be >= 1, got ", options_.every);
  CHORUS_CHECK_CONFIG(options_.threshold > 0 && options_.threshold < 1,
                      "recut: threshold must be in (0, 1), got ", options_.threshold);
  CHORUS_CHECK_CONFIG(options_.window >= 1, "recut: window must be >= 1, got ", options_.window);
  const PipelineOptions& o = request_.options;
  CHORUS_CHECK_CONFIG(static_cast<int>(cuts_.size()) == o.pipeline_stages + 1,
                      "recut: ", cuts_.size(), " cuts for ", o.pipeline_stages, " stages");
  if (request_.devices.empty())
    request_.devices.assign(o.replicas, std::vector<StageDevice>(o.pipeline_stages));
  // The speeds the start cut was chosen for: a measurement that departs from their ratios
  // re-plans at once (a device slower than its spec says).
  for (const auto& replica : request_.devices)
    for (const StageDevice& device : replica) baseline_.push_back(device.speed);
}

double RecutPolicy::predictedSeconds(const std::vector<int>& cuts,
                                     const std::vector<double>& speeds,
                                     const std::vector<std::int64_t>& shares) const {
  const PipelineOptions& o = request_.options;
  const int stages = o.pipeline_stages, m = o.micro_batches;
  double sum = 0, slowest = 0;
  for (int s = 0; s < stages; ++s) {
    double time = 0;  // the slowest replica at this stage index
    for (int r = 0; r < o.replicas; ++r) {
      const double micro = static_cast<double>((shares.at(r) + m - 1) / m);
      time = std::max(time, stageSeconds(request_, cuts.at(s), cuts.at(s + 1), micro) /
                                speeds.at(r * stages + s));
    }
    sum += time;
    slowest = std::max(slowest, time);
  }
  return sum + (m - 1) * slowest;
}

std::vector<double> RecutPolicy::medianSpeeds(double& error) const {
  std::vector<double> medians;
  error = 0;
  for (std::size_t k = 0; k < speeds_.front().size(); ++k) {
    std::vector<double> values;
    for (const auto& step : speeds_) values.push_back(step[k]);
    medians.push_back(median(values));
    error = std::max(error, medianError(values));
  }
  return medians;
}

std::vector<int> RecutPolicy::bestCut(const std::vector<double>& speeds,
                                      const std::vector<std::int64_t>& shares) const {
  CutRequest request = request_;
  request.options.partition = "auto";
  request.options.replica_shares = shares;
  const std::vector<double> scaled = relative(speeds);
  const int stages = request.options.pipeline_stages;
  for (int r = 0; r < request.options.replicas; ++r)
    for (int s = 0; s < stages; ++s) request.devices[r][s].speed = scaled[r * stages + s];
  return stageCuts(request);
}

std::optional<RecutMove> RecutPolicy::update(std::int64_t step,
                                             const std::vector<double>& compute_seconds,
                                             const std::vector<std::int64_t>& shares,
                                             double step_seconds) {
  const PipelineOptions& o = request_.options;
  const int stages = o.pipeline_stages;
  CHORUS_CHECK_CONFIG(static_cast<int>(compute_seconds.size()) == o.replicas * stages &&
                          static_cast<int>(shares.size()) == o.replicas,
                      "recut: figures of ", compute_seconds.size(), " ranks and ", shares.size(),
                      " replicas for a pipeline of ", o.replicas, " x ", stages);
  // Step 0 and the first step on a new cut pay one-time costs (allocations, caches).
  if (step <= changed_after_ + 1) return std::nullopt;
  std::vector<double> speeds;
  for (int rank = 0; rank < o.replicas * stages; ++rank) {
    const int s = rank % stages, r = rank / stages;
    if (!(compute_seconds[rank] > 0)) return std::nullopt;
    // What the rank's M micro-batches take on the reference device, against what they took.
    double reference = 0;
    for (int k = 0; k < o.micro_batches; ++k) {
      const std::int64_t micro = shares[r] / o.micro_batches + (k < shares[r] % o.micro_batches);
      if (micro > 0)
        reference += stageSeconds(request_, cuts_[s], cuts_[s + 1], static_cast<double>(micro));
    }
    speeds.push_back(reference / compute_seconds[rank]);
  }
  speeds_.push_back(std::move(speeds));
  step_seconds_.push_back(step_seconds);
  while (static_cast<int>(speeds_.size()) > options_.window) {
    speeds_.pop_front();
    step_seconds_.pop_front();
  }
  if (static_cast<int>(speeds_.size()) < options_.window) return std::nullopt;
  if (pending_) {
    const RecutMove made = *pending_;
    pending_.reset();
    const std::vector<double> window(step_seconds_.begin(), step_seconds_.end());
    const double after = median(window);
    const double gain = 1.0 - after / pending_before_;
    const double error = std::hypot(medianError(window), pending_before_error_);
    measured_ = "cut " + describeCut(made.from) + " -> " + describeCut(made.to) + " (after step " +
                std::to_string(made.step) + "): measured step " + fixed(pending_before_, 3) +
                " s -> " + fixed(after, 3) + " s (gain " + percent(gain) +
                (made.revert ? "" : "; predicted " + percent(made.predictedGain())) + ")";
    if (!made.revert && gain < -(options_.threshold + 2 * error)) {
      failed_.push_back(made.to);
      RecutMove back;
      back.step = step;
      back.from = cuts_;
      back.to = made.from;
      back.predicted_from = after;
      back.predicted_to = pending_before_;
      back.reason = "the move after step " + std::to_string(made.step) + " measured " +
                    percent(gain) + ", predicted " + percent(made.predictedGain());
      back.revert = true;
      return back;
    }
  }
  double error = 0;  // of the medians, relative: noise raises the bar of every decision
  const std::vector<double> medians = medianSpeeds(error);
  // Drift: the ratios between the ranks' speeds moved (a change of all speeds alike moves no cut).
  std::string reason;
  if (baseline_.empty()) {
    // After an undo or a reset nothing predicted these speeds: judge the cut on them now (an
    // undone cut is not retried), and measure drift from them.
    baseline_ = medians;
    reason = "first window on cut " + describeCut(cuts_);
  }
  std::vector<double> ratios;
  for (std::size_t k = 0; k < medians.size(); ++k) ratios.push_back(medians[k] / baseline_[k]);
  const double top = *std::max_element(ratios.begin(), ratios.end());
  const auto low = std::min_element(ratios.begin(), ratios.end());
  if (top / *low - 1.0 > options_.threshold + 2 * error) {
    failed_.clear();  // the speeds changed: an undone cut may fit them now
    if (reason.empty())
      reason = "rank " + std::to_string(low - ratios.begin()) + "'s speed -" +
               percent(1.0 - *low / top) + " against the others";
  }
  if (reason.empty() && step - planned_after_ < options_.every) return std::nullopt;
  if (reason.empty()) reason = "every " + std::to_string(options_.every) + " steps";
  planned_after_ = step;
  std::vector<int> best;
  try {
    best = bestCut(medians, shares);
  } catch (const ConfigError&) {
    best = cuts_;  // no cut fits the memory at these shares: keep the one that runs
  }
  if (best == cuts_ || std::find(failed_.begin(), failed_.end(), best) != failed_.end()) {
    baseline_ = medians;  // the cut is right for these speeds: drift is measured from them
    return std::nullopt;
  }
  RecutMove move;
  move.step = step;
  move.from = cuts_;
  move.to = best;
  move.predicted_from = predictedSeconds(cuts_, medians, shares);
  move.predicted_to = predictedSeconds(best, medians, shares);
  move.speeds = relative(medians);
  move.reason = reason;
  const double bar = best == previous_ ? 2 * options_.threshold : options_.threshold;
  if (move.predictedGain() > bar + 2 * error) return move;
  // Not worth it at these speeds: measure drift from them. Worth it but within the noise (a
  // window across a change of speed is noisy): keep the old speeds, so the drift re-plans
  // again on the next, cleaner window rather than being forgotten.
  if (!(move.predictedGain() > bar)) baseline_ = medians;
  return std::nullopt;
}

void RecutPolicy::moved(const RecutMove& move) {
  const std::vector<double> window(step_seconds_.begin(), step_seconds_.end());
  pending_before_ = window.empty() ? 0.0 : median(window);
  pending_before_error_ = window.empty() ? 0.0 : medianError(window);
  if (pending_before_ > 0) pending_ = move;
  previous_ = move.from;
  reset(move.to, move.step);
  // Judged at the speeds the move was decided at: if the new cut measures otherwise (the cost
  // model priced a moved layer wrong), that is drift and re-plans after one window. After an
  // undo, the first window on the old cut sets them.
  baseline_ = move.speeds;
}

void RecutPolicy::reset(std::vector<int> cuts, std::int64_t step) {
  CHORUS_CHECK_CONFIG(cuts.size() == cuts_.size(), "recut: ", cuts.size(), " cuts for ",
                      cuts_.size() - 1, " stages");
  cuts_ = std::move(cuts);
  changed_after_ = planned_after_ = step;
  speeds_.clear();
  step_seconds_.clear();
  baseline_.clear();
}

std::string RecutPolicy::takeMeasuredGain() {
  std::string text;
  text.swap(measured_);
  return text;
}

}  // namespace chorus::parallel
