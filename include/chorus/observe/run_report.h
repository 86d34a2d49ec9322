// `chorus report LOG.jsonl`: one self-contained HTML file (inline SVG plots, no script, no
// external resources) from the per-step JSON log of `chorus train --log-json`: loss and test
// accuracy, samples/s against the ideal, shares and compute per rank over time, the elastic
// recoveries (docs/elastic.md) as markers on every plot, and the run's summary.
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

// One elastic recovery: a line {"event": "recovery", ...} of the log. Value type.
struct LoggedRecovery {
  int generation = 0;
  std::int64_t redo_step = 0;  // the step the survivors redid, numbered as the log's steps
  std::vector<int> members;    // launch ranks of the survivors: rank r is members[r]
  std::vector<int> lost;       // launch ranks
  std::string reason;          // how the loss was noticed
  double agree_seconds = 0;
  double rebuild_seconds = 0;
};

// What a log holds, each in the log's order. Value type.
struct RunLog {
  std::vector<LoggedStep> steps;
  std::vector<LoggedRecovery> recoveries;
};

// Reads a log; lines of other events are skipped. Throws ConfigError when the file cannot be
// read, holds no step, or a line is neither a step nor an event object (quoting the line
// number).
RunLog readRunLog(const std::string& path);

// The ideal throughput of a step: Σ_i share_i / compute_i, what the devices would do if each
// computed all the time at its measured pace and nothing waited (0 without compute times).
double idealSamplesPerSecond(const LoggedStep& step);

// The report's HTML. `source`: the log's name, shown in the title. The per-rank plots have a
// line per launch rank: after a recovery a survivor's figures stay on its own line.
std::string renderRunReport(const RunLog& log, const std::string& source);

}  // namespace chorus::observe
