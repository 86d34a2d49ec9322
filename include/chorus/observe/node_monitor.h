// A node agent's monitoring: receives its workers' reports on the node-local channel
// (metrics_channel.h), keeps them as Prometheus metrics (node_metrics.h) and as the live page's
// history (live_state.h), and serves both over HTTP (metrics_server.h). `chorus train
// --metrics-port` runs one per node, for as long as the node's workers run. Where the node has
// NVIDIA GPUs, each scrape of /metrics also reads them through NVML (gpu_readings.h).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "chorus/observe/gpu_readings.h"
#include "chorus/observe/live_state.h"
#include "chorus/observe/metrics_channel.h"
#include "chorus/observe/metrics_server.h"
#include "chorus/observe/node_metrics.h"

namespace chorus::observe {

struct NodeMonitorOptions {
  // This node's index (the `node` label). Default: 0.
  int node = 0;
  // Where the HTTP endpoint listens (MetricsServerOptions). Defaults: "0.0.0.0", port 0.
  std::string address = "0.0.0.0";
  int port = 0;
  // Where the node's GPU readings come from. Default (null): NVML when the node has it and a
  // GPU (openNvml), else none, which the monitor logs once per process.
  std::shared_ptr<GpuSource> gpus;
};

// Starts listening and receiving in the constructor (throws ConfigError when the port cannot be
// used), stops in the destructor. Owns its thread, socket and server. Non-copyable; the
// accessors are safe from any thread.
class NodeMonitor {
 public:
  explicit NodeMonitor(const NodeMonitorOptions& options);
  ~NodeMonitor();
  NodeMonitor(const NodeMonitor&) = delete;
  NodeMonitor& operator=(const NodeMonitor&) = delete;

  int port() const { return server_->port(); }
  // The channel's socket, for the node's workers.
  const std::string& socketPath() const { return receiver_.path(); }
  const NodeMetrics& metrics() const { return metrics_; }
  const LiveState& state() const { return state_; }
  // Reports that could not be parsed (and were dropped).
  long malformedReports() const { return malformed_.load(); }

 private:
  void receiveLoop();

  MetricsReceiver receiver_;
  NodeMetrics metrics_;
  std::shared_ptr<GpuSource> gpus_;  // null: no GPU series; read by the server's thread
  LiveState state_;
  std::atomic<bool> stopping_{false};
  std::atomic<long> malformed_{0};
  std::unique_ptr<MetricsServer> server_;
  std::thread thread_;
};

// Seconds since the Unix epoch, now (the clock of RankReport::unix_time).
double unixNow();

}  // namespace chorus::observe
