// `chorus report LOG.jsonl`: one self-contained HTML file (inline SVG plots, no script, no
// external resources) from the per-step JSON log of `chorus train --log-json`: loss and test
// accuracy, samples/s against the ideal, shares and compute per rank over time, and the run's
// summary.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace chorus::observe {

// One line of the log. Value type.
struct LoggedStep {
  std::int64_t step = 0;
  double loss = 0;
  double samples_per_second = 0;
  double step_seconds = 0;
  double lr = 0;
  std::vector<double> shares;
  std::vector<double> compute_seconds;
  std::vector<double> wait_seconds;
  std::optional<double> test_accuracy;
  std::optional<double> test_loss;
  std::string rebalance;
  bool skipped = false;
};

// The steps of a log, in order. Throws ConfigError when the file cannot be read, holds no step,
// or a line is not a step object (quoting the line number).
std::vector<LoggedStep> readRunLog(const std::string& path);

// The ideal throughput of a step: Σ_i share_i / compute_i, what the devices would do if each
// computed all the time at its measured pace and nothing waited (0 without compute times).
double idealSamplesPerSecond(const LoggedStep& step);

// The report's HTML. `source`: the log's name, shown in the title.
std::string renderRunReport(const std::vector<LoggedStep>& steps, const std::string& source);

}  // namespace chorus::observe
