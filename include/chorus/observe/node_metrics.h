// The Prometheus metrics of one node: its agent feeds every worker's RankReport in and serves
// the text exposition on /metrics (metrics_server.h). Names follow Prometheus conventions: the
// `chorus_` prefix, base units (seconds, bytes), `_total` for counters, labels `rank`, `device`,
// `node`, `op`, `link`, `gpu`. The list, with what each means, is in docs/observability.md.
//
// Built on prometheus-cpp's core (Debian's prometheus-cpp-dev): its metric types and its text
// serializer; the HTTP side is the agent's own (metrics_server.h).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "chorus/observe/gpu_readings.h"
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
  // totals grew since the rank's previous report. Ranks are told apart by their launch rank
  // (RankReport::member), the `rank` label. The job-wide figures (loss, learning rate,
  // samples/s, the elastic generation and recoveries) come from the node's lowest rank.
  //
  // Elastic recovery: the launch ranks in a report's `lost` list are lost for good. The series
  // of a lost rank of this node are removed from the exposition (Prometheus marks them stale,
  // so a dashboard stops showing its last figures as current), and a later report of a lost
  // rank is ignored: a worker left out of the job cannot rejoin it (docs/elastic.md).
  void update(const RankReport& report);
  // Takes the node's GPU readings (gpu_readings.h) as the `chorus_gpu_*` gauges, labelled `node`
  // and `gpu` (NVML's index), and chorus_gpu_info with the GPU's name and PCI address. The series
  // of the previous readings that these do not repeat (a GPU no longer read, a figure it did not
  // report this time) are removed, so none shows a stale figure as current.
  void updateGpus(const std::vector<GpuReading>& readings);
  // The Prometheus text exposition format (version 0.0.4) of every metric.
  std::string exposition() const;
  // Reports taken so far.
  long reports() const;

 private:
  struct Families;  // node_metrics.cc

  // Removes every series of the rank whose last report is `last`.
  void removeRankLocked(const RankReport& last);
  // Removes every series of the GPU read as `last`.
  void removeGpuLocked(const GpuReading& last);

  const int node_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<Families> families_;
  mutable std::mutex mutex_;
  std::map<int, RankReport> last_;  // by launch rank (RankReport::member), live ranks only
  std::set<int> lost_;              // launch ranks lost from the job
  long reports_ = 0;
  std::vector<GpuReading> gpus_;  // the last readings updateGpus took
};

}  // namespace chorus::observe
