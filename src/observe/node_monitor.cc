#include "chorus/observe/node_monitor.h"

#include <chrono>

#include "chorus/core/error.h"

namespace chorus::observe {

double unixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

NodeMonitor::NodeMonitor(const NodeMonitorOptions& options)
    : metrics_(options.node), state_(options.node) {
  MetricsServerOptions server;
  server.address = options.address;
  server.port = options.port;
  server.metrics = [this] { return metrics_.exposition(); };
  server.state = [this] { return state_.json(unixNow()); };
  server_ = std::make_unique<MetricsServer>(server);
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
