#include "chorus/observe/rank_report.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chorus/core/error.h"

namespace chorus::observe {

double RankReport::utilization() const {
  if (step_seconds <= 0) return 0;
  return std::clamp(compute_seconds / step_seconds, 0.0, 1.0);
}

std::pair<std::uint64_t, std::uint64_t> processResidentSet() {
  std::ifstream status("/proc/self/status");
  std::string line;
  std::uint64_t rss = 0, peak = 0;
  while (std::getline(status, line)) {
    std::istringstream fields(line);
    std::string key;
    std::uint64_t kib = 0;
    fields >> key >> kib;
    if (key == "VmRSS:") rss = kib * 1024;
    if (key == "VmHWM:") peak = kib * 1024;
  }
  return {rss, peak};
}

std::string toJson(const RankReport& report) {
  nlohmann::json ops = nlohmann::json::object();
  for (const auto& [name, totals] : report.ops)
    ops[name] = {{"count", totals.count}, {"bytes", totals.bytes}, {"seconds", totals.seconds}};
  nlohmann::json json = {{"rank", report.rank},
                         {"member", report.member},
                         {"node", report.node},
                         {"device", report.device},
                         {"emulated", report.emulated},
                         {"step", report.step},
                         {"global_batch", report.global_batch},
                         {"share", report.share},
                         {"step_s", report.step_seconds},
                         {"samples_per_s", report.samples_per_second},
                         {"compute_s", report.compute_seconds},
                         {"wait_s", report.wait_seconds},
                         {"pad_s_total", report.pad_seconds_total},
                         {"loss", report.loss},
                         {"lr", report.lr},
                         {"loss_scale", report.loss_scale},
                         {"skipped_total", report.skipped_steps_total},
                         {"rebalances_total", report.rebalances_total},
                         {"dropped_total", report.dropped_reports_total},
                         {"memory_used", report.memory_used},
                         {"memory_reserved", report.memory_reserved},
                         {"memory_peak", report.memory_peak},
                         {"memory_budget", report.memory_budget},
                         {"link", report.link},
                         {"ops", ops},
                         {"time", report.unix_time},
                         {"generation", report.generation},
                         {"recoveries_total", report.recoveries_total},
                         {"agree_s", report.last_agree_seconds},
                         {"rebuild_s", report.last_rebuild_seconds},
                         {"lost", report.lost}};
  if (report.test_accuracy) json["test_accuracy"] = *report.test_accuracy;
  if (!report.loss_known) json["loss_known"] = false;
  return json.dump();
}

RankReport rankReportFromJson(const std::string& text) {
  try {
    const nlohmann::json json = nlohmann::json::parse(text);
    RankReport report;
    report.rank = json.at("rank").get<int>();
    report.node = json.at("node").get<int>();
    report.device = json.at("device").get<std::string>();
    report.emulated = json.at("emulated").get<bool>();
    report.step = json.at("step").get<std::int64_t>();
    report.global_batch = json.at("global_batch").get<std::int64_t>();
    report.share = json.at("share").get<std::int64_t>();
    report.step_seconds = json.at("step_s").get<double>();
    report.samples_per_second = json.at("samples_per_s").get<double>();
    report.compute_seconds = json.at("compute_s").get<double>();
    report.wait_seconds = json.at("wait_s").get<double>();
    report.pad_seconds_total = json.at("pad_s_total").get<double>();
    report.loss = json.at("loss").get<double>();
    report.lr = json.at("lr").get<double>();
    report.loss_scale = json.at("loss_scale").get<double>();
    report.skipped_steps_total = json.at("skipped_total").get<std::uint64_t>();
    report.rebalances_total = json.at("rebalances_total").get<std::uint64_t>();
    report.dropped_reports_total = json.value("dropped_total", std::uint64_t{0});
    report.memory_used = json.at("memory_used").get<std::uint64_t>();
    report.memory_reserved = json.at("memory_reserved").get<std::uint64_t>();
    report.memory_peak = json.at("memory_peak").get<std::uint64_t>();
    report.memory_budget = json.at("memory_budget").get<std::uint64_t>();
    report.link = json.at("link").get<std::string>();
    for (const auto& [name, totals] : json.at("ops").items())
      report.ops[name] = {totals.at("count").get<std::uint64_t>(),
                          totals.at("bytes").get<std::uint64_t>(),
                          totals.at("seconds").get<double>()};
    report.unix_time = json.at("time").get<double>();
    if (json.contains("test_accuracy")) report.test_accuracy = json["test_accuracy"].get<double>();
    report.member = json.value("member", report.rank);
    report.loss_known = json.value("loss_known", true);
    report.generation = json.value("generation", 0);
    report.recoveries_total = json.value("recoveries_total", std::uint64_t{0});
    report.last_agree_seconds = json.value("agree_s", 0.0);
    report.last_rebuild_seconds = json.value("rebuild_s", 0.0);
    report.lost = json.value("lost", std::vector<int>{});
    CHORUS_CHECK_CONFIG(
        report.rank >= 0 && report.member >= 0 && report.share >= 0 && report.generation >= 0,
        "a rank report with rank ", report.rank, ", member ", report.member, ", share ",
        report.share, " and generation ", report.generation);
    return report;
  } catch (const nlohmann::json::exception& error) {
    CHORUS_THROW(ConfigError, "a malformed rank report (", error.what(), ")");
  }
}

}  // namespace chorus::observe
