// The Prometheus metrics of one node: its agent feeds every worker's RankReport in and serves
// the text exposition on /metrics (metrics_server.h). Names follow Prometheus conventions: the
// `chorus_` prefix, base units (seconds, bytes), `_total` for counters, labels `rank`, `device`,
// `node`, `op`, `link`. The list, with what each means, is in docs/observability.md.
//
// Built on prometheus-cpp's core (Debian's prometheus-cpp-dev): its metric types and its text
// serializer; the HTTP side is the agent's own (metrics_server.h).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "chorus/observe/rank_report.h"

namespace prometheus {
class Registry;
}

namespace chorus::observe {

// Thread-safe: update() and exposition() may be called from different threads (a receiving
// thread and the HTTP server's). Non-copyable.
class NodeMetrics {
 public:
  explicit NodeMetrics(int node);
  ~NodeMetrics();
  NodeMetrics(const NodeMetrics&) = delete;
  NodeMetrics& operator=(const NodeMetrics&) = delete;

  // Takes one report: gauges are set to its figures, counters advance by how much its running
  // totals grew since the rank's previous report. The job-wide figures (loss, learning rate,
  // samples/s) come from the node's lowest rank.
  void update(const RankReport& report);
  // The Prometheus text exposition format (version 0.0.4) of every metric.
  std::string exposition() const;
  // Reports taken so far.
  long reports() const;

 private:
  struct Families;  // node_metrics.cc

  const int node_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<Families> families_;
  mutable std::mutex mutex_;
  std::map<int, RankReport> last_;  // by rank
  int lowest_rank_ = -1;
  long reports_ = 0;
};

}  // namespace chorus::observe
