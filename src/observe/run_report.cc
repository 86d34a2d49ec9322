#include "chorus/observe/run_report.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chorus/core/error.h"
#include "chorus/observe/svg_plot.h"

namespace chorus::observe {
namespace {

std::vector<double> numbers(const nlohmann::json& line, const char* key) {
  if (!line.contains(key)) return {};
  return line.at(key).get<std::vector<double>>();
}

LoggedStep parseStep(const nlohmann::json& line) {
  LoggedStep step;
  step.step = line.at("step").get<std::int64_t>();
  step.loss = line.at("loss").get<double>();
  step.samples_per_second = line.at("samples_per_s").get<double>();
  step.step_seconds = line.value("step_s", 0.0);
  step.lr = line.value("lr", 0.0);
  step.shares = numbers(line, "shares");
  step.compute_seconds = numbers(line, "compute_s");
  step.wait_seconds = numbers(line, "wait_s");
  if (line.contains("test_accuracy")) step.test_accuracy = line["test_accuracy"].get<double>();
  if (line.contains("test_loss")) step.test_loss = line["test_loss"].get<double>();
  step.rebalance = line.value("rebalance", std::string());
  step.skipped = line.value("skipped", false);
  return step;
}

LoggedRecovery parseRecovery(const nlohmann::json& line) {
  LoggedRecovery recovery;
  recovery.generation = line.at("generation").get<int>();
  recovery.redo_step = line.at("redo_step").get<std::int64_t>();
  recovery.members = line.value("members", std::vector<int>{});
  recovery.lost = line.at("lost").get<std::vector<int>>();
  recovery.reason = line.value("reason", std::string());
  recovery.agree_seconds = line.value("agree_s", 0.0);
  recovery.rebuild_seconds = line.value("rebuild_s", 0.0);
  return recovery;
}

std::string joined(const std::vector<int>& values) {
  std::string text;
  for (size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + std::to_string(values[i]);
  return text;
}

std::string lostText(const LoggedRecovery& recovery) {
  return std::string(recovery.lost.size() == 1 ? "lost rank " : "lost ranks ") +
         joined(recovery.lost);
}

// The launch rank of `rank` in `step`: its place in the members of the last recovery at or
// before the step; itself before any.
size_t launchRank(const std::vector<LoggedRecovery>& recoveries, std::int64_t step, size_t rank) {
  size_t launch = rank;
  for (const LoggedRecovery& recovery : recoveries)
    if (recovery.redo_step <= step && rank < recovery.members.size())
      launch = static_cast<size_t>(recovery.members[rank]);
  return launch;
}

std::string fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

size_t rankCount(const std::vector<LoggedStep>& steps) {
  size_t ranks = 0;
  for (const LoggedStep& step : steps) ranks = std::max(ranks, step.shares.size());
  return ranks;
}

// One line per launch rank of `field` (shares or compute times, scaled).
std::vector<PlotSeries> perRank(const RunLog& log, std::vector<double> LoggedStep::*field,
                                double scale) {
  std::vector<PlotSeries> lines(rankCount(log.steps));
  for (size_t rank = 0; rank < lines.size(); ++rank)
    lines[rank].name = "rank " + std::to_string(rank);
  for (const LoggedStep& step : log.steps)
    for (size_t rank = 0; rank < (step.*field).size(); ++rank) {
      const size_t launch = launchRank(log.recoveries, step.step, rank);
      if (launch >= lines.size()) continue;
      lines[launch].xs.push_back(static_cast<double>(step.step));
      lines[launch].ys.push_back((step.*field)[rank] * scale);
    }
  return lines;
}

std::string recoveriesRow(const std::vector<LoggedRecovery>& recoveries) {
  if (recoveries.empty()) return "";
  std::string cell;
  for (const LoggedRecovery& r : recoveries)
    cell += (cell.empty() ? "" : "<br>") + std::string("step ") + std::to_string(r.redo_step) +
            ": " + lostText(r) + " (" + escapeXml(r.reason) + "), generation " +
            std::to_string(r.generation) + ", agree " + fixed(r.agree_seconds, 3) + " s, rebuild " +
            fixed(r.rebuild_seconds, 3) + " s";
  return "<tr><th>recoveries</th><td id=\"summary-recoveries\">" + cell + "</td></tr>\n";
}

std::string summary(const RunLog& log) {
  const std::vector<LoggedStep>& steps = log.steps;
  double seconds = 0, best_accuracy = -1, ideal = 0;
  int rebalances = 0, skipped = 0, evaluations = 0;
  for (const LoggedStep& step : steps) {
    seconds += step.step_seconds;
    if (!step.rebalance.empty()) ++rebalances;
    if (step.skipped) ++skipped;
    if (step.test_accuracy) {
      ++evaluations;
      best_accuracy = std::max(best_accuracy, *step.test_accuracy);
    }
  }
  // Throughput of the second half: past the balancer's profiling and warm-up.
  const size_t half = steps.size() / 2;
  double samples = 0, half_seconds = 0;
  for (size_t i = half; i < steps.size(); ++i) {
    samples += steps[i].step_seconds * steps[i].samples_per_second;
    half_seconds += steps[i].step_seconds;
    ideal += idealSamplesPerSecond(steps[i]);
  }
  ideal /= static_cast<double>(steps.size() - half);
  const double throughput = half_seconds > 0 ? samples / half_seconds : 0;
  const LoggedStep& last = steps.back();
  std::ostringstream shares;
  for (size_t i = 0; i < last.shares.size(); ++i)
    shares << (i ? ", " : "") << static_cast<long long>(last.shares[i]);
  std::ostringstream html;
  html << "<table class=\"summary\">\n"
       << "<tr><th>steps</th><td id=\"summary-steps\">" << steps.size() << " ("
       << steps.front().step << " to " << last.step << ")</td></tr>\n"
       << "<tr><th>ranks</th><td id=\"summary-ranks\">" << rankCount(steps) << "</td></tr>\n"
       << "<tr><th>time in steps</th><td>" << fixed(seconds, 1) << " s</td></tr>\n"
       << "<tr><th>samples/s (second half)</th><td id=\"summary-throughput\">"
       << fixed(throughput, 1) << " of an ideal " << fixed(ideal, 1) << " ("
       << fixed(ideal > 0 ? throughput / ideal : 0, 2) << ")</td></tr>\n"
       << "<tr><th>final loss</th><td>" << fixed(last.loss, 4) << "</td></tr>\n"
       << "<tr><th>best test accuracy</th><td>"
       << (evaluations
               ? fixed(best_accuracy, 4) + " (" + std::to_string(evaluations) + " evaluations)"
               : std::string("not evaluated"))
       << "</td></tr>\n"
       << "<tr><th>final shares</th><td>" << shares.str() << "</td></tr>\n"
       << "<tr><th>balancer changes</th><td>" << rebalances << "</td></tr>\n"
       << "<tr><th>skipped steps</th><td>" << skipped << "</td></tr>\n"
       << recoveriesRow(log.recoveries) << "</table>\n";
  return html.str();
}

}  // namespace

RunLog readRunLog(const std::string& path) {
  std::ifstream in(path);
  if (!in) CHORUS_THROW(ConfigError, "chorus report: cannot read ", path);
  RunLog log;
  std::string text;
  int number = 0;
  while (std::getline(in, text)) {
    ++number;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      const nlohmann::json line = nlohmann::json::parse(text);
      if (line.is_object() && line.contains("event")) {
        // Events between steps: an elastic recovery; later kinds are skipped.
        if (line.at("event") == "recovery") log.recoveries.push_back(parseRecovery(line));
        continue;
      }
      log.steps.push_back(parseStep(line));
    } catch (const nlohmann::json::exception& error) {
      CHORUS_THROW(ConfigError, "chorus report: ", path, " line ", number,
                   " is not a step or event of a --log-json log (", error.what(), ")");
    }
  }
  CHORUS_CHECK_CONFIG(!log.steps.empty(), "chorus report: ", path, " holds no step");
  return log;
}

double idealSamplesPerSecond(const LoggedStep& step) {
  double ideal = 0;
  for (size_t i = 0; i < step.shares.size() && i < step.compute_seconds.size(); ++i)
    if (step.compute_seconds[i] > 0) ideal += step.shares[i] / step.compute_seconds[i];
  return ideal;
}

std::string renderRunReport(const RunLog& log, const std::string& source) {
  const std::vector<LoggedStep>& steps = log.steps;
  PlotSeries loss{"training loss", {}, {}}, test_loss{"test loss", {}, {}, true};
  PlotSeries accuracy{"test accuracy", {}, {}};
  PlotSeries throughput{"samples/s", {}, {}}, ideal{"ideal (sum of share / compute)", {}, {}, true};
  for (const LoggedStep& step : steps) {
    const double x = static_cast<double>(step.step);
    loss.xs.push_back(x);
    loss.ys.push_back(step.loss);
    throughput.xs.push_back(x);
    throughput.ys.push_back(step.samples_per_second);
    ideal.xs.push_back(x);
    ideal.ys.push_back(idealSamplesPerSecond(step));
    if (step.test_loss) {
      test_loss.xs.push_back(x);
      test_loss.ys.push_back(*step.test_loss);
    }
    if (step.test_accuracy) {
      accuracy.xs.push_back(x);
      accuracy.ys.push_back(*step.test_accuracy);
    }
  }
  std::ostringstream html;
  html << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>chorus report: "
       << escapeXml(source) << "</title>\n<style>body{font:14px/1.4 system-ui,sans-serif;"
       << "margin:20px;color:#222}h1{font-size:20px}.plots{display:flex;flex-wrap:wrap;gap:16px}"
       << ".summary th{text-align:left;padding-right:16px}svg{background:#fff;border:1px solid "
       << "#ddd}</style></head>\n<body>\n<h1>chorus report: " << escapeXml(source) << "</h1>\n"
       << summary(log) << "<div class=\"plots\">\n";
  PlotOptions options;
  for (const LoggedRecovery& recovery : log.recoveries)
    options.markers.push_back(
        {static_cast<double>(recovery.redo_step), "recovery: " + lostText(recovery)});
  options.title = "Loss";
  options.y_label = "loss";
  html << svgLinePlot({loss, test_loss}, options);
  options.title = "Test accuracy";
  options.y_label = "accuracy";
  html << svgLinePlot({accuracy}, options);
  options.title = "Throughput against the ideal";
  options.y_label = "samples/s";
  html << svgLinePlot({throughput, ideal}, options);
  options.title = "Share of the global batch per rank";
  options.y_label = "samples";
  html << svgLinePlot(perRank(log, &LoggedStep::shares, 1), options);
  options.title = "Compute per rank";
  options.y_label = "ms per step";
  html << svgLinePlot(perRank(log, &LoggedStep::compute_seconds, 1000), options);
  options.title = "Wait for the all-reduce per rank";
  html << svgLinePlot(perRank(log, &LoggedStep::wait_seconds, 1000), options);
  html << "</div>\n<p>Memory is not in the --log-json log; the live metrics "
       << "(chorus_memory_*_bytes) carry it.</p>\n</body></html>\n";
  return html.str();
}

}  // namespace chorus::observe
