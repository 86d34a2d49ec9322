// What the live page shows of a node (metrics_server.h serves it as JSON on /api/state): each
// rank's recent share, compute, wait and memory per step, the job's throughput and loss, the
// current plan (every rank's share of B), and alerts — a rank that holds back the step, one
// that stopped reporting (lost), or one the job lost and recovered from (elastic recovery,
// docs/elastic.md). Ranks are named by their launch rank (RankReport::member), which a worker
// keeps through recoveries.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "chorus/observe/rank_report.h"

namespace chorus::observe {

// Thread-safe (one mutex): update() from the receiving thread, json() from HTTP threads.
// Bounded: keeps the last `history` steps of each rank. Non-copyable.
class LiveState {
 public:
  // `history`: steps kept per rank. Default: 300.
  explicit LiveState(int node, size_t history = 300);
  LiveState(const LiveState&) = delete;
  LiveState& operator=(const LiveState&) = delete;

  // Takes one report. The launch ranks in its `lost` list are lost for good: their history is
  // dropped (they leave the table and the charts) and a later report of theirs is ignored.
  void update(const RankReport& report);
  // The state as JSON: {"node", "time", "generation", "lost": [launch rank], "ranks": [{"rank",
  // "device", "emulated", "step", "age_s", "series": {"step", "share", "compute_s", "wait_s",
  // "memory_bytes"}}], "job": {"step", "samples_per_s", "loss"}, "plan": {"global_batch",
  // "shares"}, "alerts": [text]}. `now`: Unix time, for the ages of the ranks' last reports.
  std::string json(double now) const;
  // The alert lines at `now`: "rank N lost (generation G)" for each rank the job lost, G being
  // the generation of the first report that listed it lost (the generation the survivors went
  // on in); a rank whose compute holds back the steps (over the last few steps it computed
  // longest and the others waited at least a quarter of the step for it); or one silent for
  // longer than 10 s (or 10 step times, when steps are longer) — lost, not yet recovered from.
  std::vector<std::string> alerts(double now) const;

 private:
  struct Point {
    std::int64_t step;
    double share, compute_s, wait_s, memory_bytes, step_s;
  };
  struct RankHistory {
    RankReport last;
    std::deque<Point> points;
  };
  struct JobPoint {
    std::int64_t step;
    double samples_per_s, loss;
  };
  std::vector<std::string> alertsLocked(double now) const;

  const int node_;
  const size_t history_;
  mutable std::mutex mutex_;
  std::map<int, RankHistory> ranks_;  // by launch rank, live ranks only
  std::deque<JobPoint> job_;
  int generation_ = 0;
  std::map<int, int> lost_;  // launch rank -> the generation that went on without it
};

}  // namespace chorus::observe
