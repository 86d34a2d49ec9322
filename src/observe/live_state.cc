#include "chorus/observe/live_state.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace chorus::observe {
namespace {

// A rank holds back the step when the others waited, on average, at least this fraction of the
// step for the all-reduce while it computed longest.
constexpr double kHoldBackWaitFraction = 0.25;
constexpr double kLostAfterSeconds = 10.0;
constexpr double kLostAfterSteps = 10.0;
// The hold-back alert looks at means over this many recent steps, so one noisy step does not
// raise it.
constexpr size_t kHoldBackSteps = 5;

struct RecentMeans {
  double compute_s = 0, wait_s = 0, step_s = 0;
};

std::string fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

}  // namespace

LiveState::LiveState(int node, size_t history)
    : node_(node), history_(std::max<size_t>(history, 2)) {}

void LiveState::update(const RankReport& report) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (lost_.count(report.member)) return;
  for (int member : report.lost)
    if (lost_.emplace(member, report.generation).second) ranks_.erase(member);
  generation_ = std::max(generation_, report.generation);
  RankHistory& rank = ranks_[report.member];
  rank.last = report;
  rank.points.push_back({report.step, static_cast<double>(report.share), report.compute_seconds,
                         report.wait_seconds, static_cast<double>(report.memory_used),
                         report.step_seconds});
  while (rank.points.size() > history_) rank.points.pop_front();
  // The job's figures from the lowest rank, once per step.
  if (report.member == ranks_.begin()->first && (job_.empty() || job_.back().step != report.step)) {
    job_.push_back({report.step, report.samples_per_second, report.loss});
    while (job_.size() > history_) job_.pop_front();
  }
}

std::vector<std::string> LiveState::alerts(double now) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return alertsLocked(now);
}

std::vector<std::string> LiveState::alertsLocked(double now) const {
  std::vector<std::string> alerts;
  for (const auto& [member, generation] : lost_)
    alerts.push_back("rank " + std::to_string(member) + " lost (generation " +
                     std::to_string(generation) + ")");
  if (ranks_.empty()) return alerts;
  std::int64_t latest = 0;
  double step_seconds = 0;
  for (const auto& [rank, history] : ranks_) {
    latest = std::max(latest, history.last.step);
    step_seconds = std::max(step_seconds, history.last.step_seconds);
  }
  const double lost_after = std::max(kLostAfterSeconds, kLostAfterSteps * step_seconds);
  for (const auto& [rank, history] : ranks_) {
    const double age = now - history.last.unix_time;
    if (age > lost_after)
      alerts.push_back("rank " + std::to_string(rank) + " (" + history.last.device +
                       ") lost: no report for " + fixed(age, 0) + " s, last at step " +
                       std::to_string(history.last.step));
  }
  // Hold-back: among the ranks at the latest step, the slowest compute over the recent steps
  // while the others waited.
  std::map<int, RecentMeans> recent;
  for (const auto& [rank, history] : ranks_) {
    if (history.last.step != latest) continue;
    RecentMeans& means = recent[rank];
    const size_t count = std::min(kHoldBackSteps, history.points.size());
    for (size_t i = history.points.size() - count; i < history.points.size(); ++i) {
      means.compute_s += history.points[i].compute_s / count;
      means.wait_s += history.points[i].wait_s / count;
      means.step_s += history.points[i].step_s / count;
    }
  }
  int slowest = -1;
  for (const auto& [rank, means] : recent)
    if (slowest < 0 || means.compute_s > recent[slowest].compute_s) slowest = rank;
  double others_wait = 0;
  int others = 0;
  for (const auto& [rank, means] : recent) {
    if (rank == slowest) continue;
    others_wait += means.wait_s;
    ++others;
  }
  if (others > 0 && recent[slowest].step_s > 0) {
    const double mean_wait = others_wait / others;
    const RankReport& last = ranks_.at(slowest).last;
    if (mean_wait >= kHoldBackWaitFraction * recent[slowest].step_s)
      alerts.push_back("rank " + std::to_string(slowest) + " (" + last.device +
                       ") holds back the steps: over the last ones it computed " +
                       fixed(recent[slowest].compute_s * 1000, 0) +
                       " ms a step while the others waited " + fixed(mean_wait * 1000, 0) +
                       " ms on average");
  }
  return alerts;
}

std::string LiveState::json(double now) const {
  std::lock_guard<std::mutex> lock(mutex_);
  nlohmann::json ranks = nlohmann::json::array();
  nlohmann::json shares = nlohmann::json::object();
  std::int64_t global_batch = 0;
  for (const auto& [rank, history] : ranks_) {
    nlohmann::json series = {{"step", nlohmann::json::array()},
                             {"share", nlohmann::json::array()},
                             {"compute_s", nlohmann::json::array()},
                             {"wait_s", nlohmann::json::array()},
                             {"memory_bytes", nlohmann::json::array()}};
    for (const Point& point : history.points) {
      series["step"].push_back(point.step);
      series["share"].push_back(point.share);
      series["compute_s"].push_back(point.compute_s);
      series["wait_s"].push_back(point.wait_s);
      series["memory_bytes"].push_back(point.memory_bytes);
    }
    const RankReport& last = history.last;
    ranks.push_back({{"rank", rank},
                     {"device", last.device},
                     {"emulated", last.emulated},
                     {"step", last.step},
                     {"age_s", now - last.unix_time},
                     {"utilization", last.utilization()},
                     {"memory_budget", last.memory_budget},
                     {"series", series}});
    shares[std::to_string(rank)] = last.share;
    global_batch = last.global_batch;
  }
  nlohmann::json job = {{"step", nlohmann::json::array()},
                        {"samples_per_s", nlohmann::json::array()},
                        {"loss", nlohmann::json::array()}};
  for (const JobPoint& point : job_) {
    job["step"].push_back(point.step);
    job["samples_per_s"].push_back(point.samples_per_s);
    job["loss"].push_back(point.loss);
  }
  nlohmann::json lost = nlohmann::json::array();
  for (const auto& [member, generation] : lost_) lost.push_back(member);
  return nlohmann::json{{"node", node_},
                        {"time", now},
                        {"generation", generation_},
                        {"lost", lost},
                        {"ranks", ranks},
                        {"job", job},
                        {"plan", {{"global_batch", global_batch}, {"shares", shares}}},
                        {"alerts", alertsLocked(now)}}
      .dump();
}

}  // namespace chorus::observe
