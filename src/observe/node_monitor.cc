#include "chorus/observe/node_monitor.h"

#include <chrono>
#include <mutex>

#include "chorus/core/error.h"
#include "chorus/core/logging.h"

namespace chorus::observe {
namespace {

// Said once per process, at info level: a node without NVML or a GPU (every CPU host) is meant
// to run so, it is not a fault.
void logNoGpus(const std::string& why) {
  static std::once_flag logged;
  std::call_once(logged, [&] { logInfo("no GPU metrics on this node: ", why); });
}

}  // namespace

double unixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

NodeMonitor::NodeMonitor(const NodeMonitorOptions& options)
    : metrics_(options.node), gpus_(options.gpus), state_(options.node) {
  // Opened before the server starts: its thread reads gpus_ from the first scrape on.
  std::string no_gpus;
  if (!gpus_) {
    NvmlOpening nvml = openNvml();
    gpus_ = std::move(nvml.source);
    no_gpus = nvml.absent;
  }
  MetricsServerOptions server;
  server.address = options.address;
  server.port = options.port;
  server.metrics = [this] {
    // Read at scrape time, as a Prometheus collector does: fresh figures, and no cost on a node
    // nobody scrapes.
    if (gpus_) metrics_.updateGpus(gpus_->read());
    return metrics_.exposition();
  };
  server.state = [this] { return state_.json(unixNow()); };
  server_ = std::make_unique<MetricsServer>(server);
  if (!gpus_) logNoGpus(no_gpus);  // after the port's refusal, which must be the only line
  thread_ = std::thread([this] { receiveLoop(); });
}

NodeMonitor::~NodeMonitor() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  server_.reset();  // before the metrics and state its callbacks read
}

void NodeMonitor::receiveLoop() {
  while (!stopping_) {
    const auto message = receiver_.receive(std::chrono::milliseconds(100));
    if (!message) continue;
    try {
      const RankReport report = rankReportFromJson(*message);
      metrics_.update(report);
      state_.update(report);
    } catch (const Error&) {
      ++malformed_;
    }
  }
}

}  // namespace chorus::observe
