// The HTTP endpoint of a node's agent (`chorus train --metrics-port`): /metrics in Prometheus's
// text format, / the live page (livePageHtml below, no external resources), /api/state the JSON the
// page polls. The exposition is prometheus-cpp's (node_metrics.h); the HTTP server is our own:
// prometheus-cpp's Exposer runs on civetweb, whose threads have a compiled-in 100 KiB stack that
// cannot hold the static TLS of a process with libtorch and CUDA libraries loaded (cublasLt alone
// has 94 KiB), so it fails to start in `chorus train` (pthread_create: EINVAL). One thread, one
// client at a time, Connection: close: enough for Prometheus and the page's poll.
#pragma once

#include <functional>
#include <memory>
#include <string>

namespace chorus::observe {

struct MetricsServerOptions {
  // Address to listen on. Default: "0.0.0.0" (every interface: a Prometheus on another host
  // scrapes it). The endpoint has no authentication; see docs/security.md.
  std::string address = "0.0.0.0";
  // TCP port; 0 picks a free one (port() tells which). Default: 0.
  int port = 0;
  // Produce the bodies of /metrics and /api/state. Required. Called from server threads.
  std::function<std::string()> metrics;
  std::function<std::string()> state;
};

// Throws ConfigError unless `port` is 0..65535, and, for a process whose effective uid is not 0,
// at least 1024 (ports below are privileged). Checked before a job starts.
void checkMetricsPort(int port, unsigned effective_uid);

// Listens from construction to destruction, serving from its own thread. Throws ConfigError when
// it cannot listen (the port is busy, the address is not local). Non-copyable; port() is safe
// from any thread.
class MetricsServer {
 public:
  explicit MetricsServer(MetricsServerOptions options);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The port it listens on (the free one picked for port 0).
  int port() const { return port_; }

  struct Context;  // metrics_server.cc

 private:
  std::unique_ptr<Context> context_;
  int port_ = 0;
};

// The live page served on / : one self-contained HTML document (its script and styles inline, no
// external resources) that polls /api/state (live_state.h) every second and draws, per rank, the
// share, compute and wait times and memory over the last steps, the job's throughput and loss,
// the current plan, and an alert line when a rank holds back the step or was lost. Constant.
const std::string& livePageHtml();

}  // namespace chorus::observe
