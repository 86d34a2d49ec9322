// `chorus train --metrics-port`, both ends. The agent's: the node monitor (observe/
// node_monitor.h), started before any worker so that a port that cannot be used is refused before
// training starts. A worker's: after each step it sends its agent a RankReport
// (observe/rank_report.h) over the node-local channel: the rank's share, compute and wait times,
// padding, memory, collective totals, and the step's loss and learning rate.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "chorus/observe/metrics_channel.h"
#include "chorus/observe/node_monitor.h"
#include "chorus/runtime/launch/worker.h"
#include "chorus/runtime/train/trainer.h"

namespace chorus::cli {

// Checks the port (range; below 1024 only as root), listens, logs where ("chorus train: metrics
// on http://HOST:PORT/metrics, live page on http://HOST:PORT/"), and returns the running
// monitor. Throws ConfigError when the port cannot be used (busy, privileged).
std::unique_ptr<observe::NodeMonitor> startTrainMonitor(int port, int node_rank);

// Owned by the worker's main; used by the training thread only. Never blocks a step: a report
// the agent cannot take at once is dropped (MetricsSender).
class TrainMetrics {
 public:
  TrainMetrics(const std::string& socket_path, std::shared_ptr<runtime::Worker> worker,
               std::int64_t global_batch);
  // Sends the report of the step `record` describes.
  void step(const runtime::StepRecord& record);
  // Takes an elastic recovery (TrainerHooks::on_recovery): the reports of the steps after it
  // carry its generation and times, the recoveries so far and every launch rank lost so far.
  // Sends nothing itself.
  void recovery(const runtime::RecoveryRecord& record);

 private:
  observe::MetricsSender sender_;
  std::shared_ptr<runtime::Worker> worker_;
  std::int64_t global_batch_;
  std::uint64_t skipped_ = 0;
  std::uint64_t rebalances_ = 0;
  int generation_ = 0;
  std::uint64_t recoveries_ = 0;
  double agree_seconds_ = 0;
  double rebuild_seconds_ = 0;
  std::vector<int> lost_;  // ascending, cumulative
};

}  // namespace chorus::cli
