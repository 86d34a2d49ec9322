#include "train_report.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chorus/core/error.h"

namespace chorus::cli {
namespace {

std::string joined(const std::vector<std::int64_t>& values) {
  std::ostringstream out;
  for (size_t i = 0; i < values.size(); ++i) out << (i ? "," : "") << values[i];
  return out.str();
}

// Wall-clock time of a log line (seconds since the epoch), so that events of several processes
// can be put on one time line (bench/elastic.py measures recoveries with it).
double unixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string clockText(double seconds) {
  const long total = static_cast<long>(seconds + 0.5);
  char text[32];
  std::snprintf(text, sizeof text, "%ld:%02ld", total / 60, total % 60);
  return text;
}

std::string scalesText(const std::vector<double>& scales) {
  std::ostringstream out;
  for (size_t i = 0; i < scales.size(); ++i) out << (i ? "," : "") << scales[i];
  return out.str();
}

// "balance=adaptive" for data parallelism; the pipeline's shape otherwise.
std::string parallelism(const runtime::JobConfig& job, const plan::Plan& plan) {
  std::ostringstream text;
  if (plan.stageCount() == 1) {
    text << "balance=" << job.balancer.mode;
  } else {
    text << "pipeline " << plan.stageCount() << " stages x " << plan.replicas.size()
         << (plan.replicas.size() == 1 ? " replica" : " replicas") << " ("
         << plan::toString(plan.schedule) << ", " << plan.micro_batches << " micro-batches, layers";
    for (size_t s = 0; s < plan.replicas[0].stages.size(); ++s)
      text << (s ? "/" : " ")
           << plan.replicas[0].stages[s].last_layer - plan.replicas[0].stages[s].first_layer;
    text << ")";
  }
  return text.str();
}

}  // namespace

TrainReport::TrainReport(const runtime::JobConfig& job, const plan::Plan& plan,
                         std::function<bool()> is_writer, const std::string& json_path)
    : job_(job), is_writer_(std::move(is_writer)), json_path_(json_path) {
  writing_ = is_writer_();
  if (!writing_) return;
  if (!json_path.empty()) {
    // Appended to (the front end emptied it): a writer that takes over after an elastic recovery
    // appends too, and neither overwrites the other's lines.
    json_.open(json_path, std::ios::app);
    if (!json_) CHORUS_THROW(ConfigError, "--log-json: cannot write ", json_path);
  }
  std::cout << "chorus train: " << job_.model.kind << " on " << job_.data.dataset << ", "
            << job_.train.steps << " steps of " << job_.train.global_batch << " samples, "
            << parallelism(job_, plan) << ", config " << job_.source << std::endl;
}

void TrainReport::takeOver() {
  writing_ = true;
  if (json_path_.empty()) return;
  std::int64_t logged = 0;  // the last step in the log
  {
    std::ifstream in(json_path_);
    std::string line, last_line;
    while (std::getline(in, line))
      if (!line.empty()) last_line = line;
    const auto json = nlohmann::json::parse(last_line, nullptr, false);
    if (!json.is_discarded() && json.contains("step") && !json.contains("event"))
      logged = json.at("step").get<std::int64_t>();
  }
  json_.open(json_path_, std::ios::app);
  if (!json_) CHORUS_THROW(ConfigError, "--log-json: cannot write ", json_path_);
  if (last_ && last_->step + 1 > logged) writeJson(*last_);
}

void TrainReport::progressLine(const runtime::StepRecord& record) const {
  const double done = static_cast<double>(record.step + 1);
  const double eta = clock_.seconds() / done * (job_.train.steps - done);
  char line[512];
  std::snprintf(line, sizeof line, "step %lld/%lld | loss %.4f | %.0f samples/s | lr %.4g | ",
                static_cast<long long>(record.step + 1), static_cast<long long>(job_.train.steps),
                record.loss, record.samples_per_second, record.lr);
  std::ostringstream compute;
  for (size_t i = 0; i < record.compute_seconds.size(); ++i)
    compute << (i ? "," : "") << static_cast<int>(record.compute_seconds[i] * 1000 + 0.5);
  std::cout << line << "shares " << joined(record.shares) << " | compute ms " << compute.str()
            << " | ETA " << clockText(eta) << std::endl;
}

void TrainReport::step(const runtime::StepRecord& record) {
  last_ = record;
  if (!writing_) return;
  if (!is_writer_()) {
    held_ = record;
    return;
  }
  if (record.skipped)
    std::printf("step %lld skipped: gradients overflowed on some rank; loss scales now %s\n",
                static_cast<long long>(record.step + 1), scalesText(record.loss_scales).c_str());
  const bool last = record.step + 1 == job_.train.steps;
  if ((record.step + 1) % job_.train.log_every == 0 || last || record.step == 0)
    progressLine(record);
  if (record.test_accuracy) {
    std::printf("eval at step %lld: test accuracy %.4f, test loss %.4f\n",
                static_cast<long long>(record.step + 1), *record.test_accuracy,
                record.test_loss.value_or(0.0));
    std::fflush(stdout);
    if (target_step_ < 0 && job_.train.target_accuracy > 0 &&
        *record.test_accuracy >= job_.train.target_accuracy)
      target_step_ = record.step + 1;
  }
  writeJson(record);
}

void TrainReport::recovery(const runtime::RecoveryRecord& record) {
  generation_ = record.generation;
  if (!writing_ && is_writer_()) takeOver();
  if (!writing_) return;
  // The job completed every step before the one it redoes: a step held back is one of them.
  if (held_ && held_->step < record.step) writeJson(*held_);
  held_.reset();
  if (record.joined.empty())
    std::printf("recovered: generation %d, lost rank %s (%s); %zu ranks go on from step %lld\n",
                record.generation, joined({record.lost.begin(), record.lost.end()}).c_str(),
                record.reason.c_str(), record.members.size(),
                static_cast<long long>(record.step + 1));
  else
    std::printf(
        "regrouped: generation %d, lost rank %s, joined rank %s (%s); %zu ranks go on from step "
        "%lld\n",
        record.generation,
        record.lost.empty() ? "none" : joined({record.lost.begin(), record.lost.end()}).c_str(),
        joined({record.joined.begin(), record.joined.end()}).c_str(), record.reason.c_str(),
        record.members.size(), static_cast<long long>(record.step + 1));
  std::fflush(stdout);
  if (!json_.is_open()) return;
  nlohmann::json line = {{"event", "recovery"},
                         {"time", unixSeconds()},
                         {"generation", record.generation},
                         {"members", record.members},
                         {"lost", record.lost},
                         {"joined", record.joined},
                         {"reason", record.reason},
                         {"redo_step", record.step + 1},
                         {"source", record.source},
                         {"shares", record.shares},
                         {"agree_s", record.agree_seconds},
                         {"rebuild_s", record.rebuild_seconds}};
  json_ << line.dump() << '\n';
  json_.flush();
}

void TrainReport::writeJson(const runtime::StepRecord& record) {
  if (!json_.is_open()) return;
  nlohmann::json line = {
      {"step", record.step + 1},       {"time", unixSeconds()},
      {"loss", record.loss},           {"samples_per_s", record.samples_per_second},
      {"step_s", record.step_seconds}, {"lr", record.lr},
      {"shares", record.shares},       {"compute_s", record.compute_seconds},
      {"wait_s", record.wait_seconds}};
  if (record.test_accuracy) line["test_accuracy"] = *record.test_accuracy;
  if (record.test_loss) line["test_loss"] = *record.test_loss;
  if (!record.rebalance.empty()) line["rebalance"] = record.rebalance;
  if (!record.recut.empty()) line["recut"] = record.recut;
  if (record.skipped) line["skipped"] = true;
  if (generation_ > 0) line["generation"] = generation_;
  if (std::any_of(record.loss_scales.begin(), record.loss_scales.end(),
                  [](double scale) { return scale > 0; }))
    line["loss_scales"] = record.loss_scales;
  json_ << line.dump() << '\n';
  json_.flush();
}

void TrainReport::finish(const runtime::TrainResult& result) {
  if (!writing_) return;
  std::printf(
      "done: %lld steps in %.1f s, %.0f samples/s, final loss %.4f, test accuracy %.4f (whole test "
      "split)",
      static_cast<long long>(result.steps), result.wall_seconds, result.samples_per_second,
      result.final_loss, result.test_accuracy.value_or(0.0));
  if (job_.train.target_accuracy > 0)
    std::printf(result.reached_target ? " (target %.2f reached at step %lld)"
                                      : " (target %.2f not reached)",
                job_.train.target_accuracy, static_cast<long long>(target_step_));
  std::printf("\n");
  if (result.skipped_steps > 0)
    std::printf("%lld steps skipped on gradient overflow\n",
                static_cast<long long>(result.skipped_steps));
  if (result.interrupted)
    std::printf("stopped on request after step %lld\n", static_cast<long long>(result.steps));
  if (!result.last_checkpoint.empty())
    std::printf("checkpoint: %s\n", result.last_checkpoint.c_str());
  std::fflush(stdout);
}

}  // namespace chorus::cli
