#include "train_metrics.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <sstream>

#include "chorus/device/memory_budget.h"
#include "chorus/device/speed_emulator.h"
#include "chorus/observe/metrics_server.h"
#include "chorus/observe/node_monitor.h"
#include "chorus/observe/rank_report.h"

namespace chorus::cli {
namespace {

template <typename T>
T at(const std::vector<T>& values, int rank) {
  return rank >= 0 && static_cast<size_t>(rank) < values.size() ? values[rank] : T{};
}

}  // namespace

TrainMetrics::TrainMetrics(const std::string& socket_path, std::shared_ptr<runtime::Worker> worker,
                           std::int64_t global_batch)
    : sender_(socket_path), worker_(std::move(worker)), global_batch_(global_batch) {}

void TrainMetrics::step(const runtime::StepRecord& record) {
  const int rank = worker_->rank();
  const auto& identity = worker_->identity();
  if (record.skipped) ++skipped_;
  if (!record.rebalance.empty()) ++rebalances_;
  observe::RankReport report;
  report.rank = rank;
  report.member = worker_->member();
  report.node = identity.node_rank;
  report.device = identity.device.toString();
  report.emulated = identity.device.emulated();
  report.step = record.step + 1;
  report.global_batch = global_batch_;
  report.share = at(record.shares, rank);
  report.step_seconds = record.step_seconds;
  report.samples_per_second = record.samples_per_second;
  report.compute_seconds = at(record.compute_seconds, rank);
  report.wait_seconds = at(record.wait_seconds, rank);
  report.pad_seconds_total = worker_->emulator().totals().padded_seconds;
  report.loss = record.loss;
  report.lr = record.lr;
  report.loss_scale = at(record.loss_scales, rank);
  report.skipped_steps_total = skipped_;
  report.rebalances_total = rebalances_;
  report.dropped_reports_total = static_cast<std::uint64_t>(sender_.dropped());
  report.test_accuracy = record.test_accuracy;
  const auto [rss, rss_peak] = observe::processResidentSet();
  report.memory_reserved = rss;
  const auto gpu = identity.device.kind == DeviceKind::kCuda
                       ? device::cudaMemoryFigures(identity.device.index)
                       : std::nullopt;
  if (gpu) {
    // A GPU rank's memory is its device's, as libtorch's caching allocator holds it; the
    // process's resident set says nothing about it. Its budget caps that allocator.
    report.memory_used = gpu->allocated;
    report.memory_reserved = gpu->reserved;
    report.memory_peak = gpu->allocated_peak;
    report.memory_budget = identity.device.memory_budget.value_or(0);
  } else if (const auto budget = worker_->memoryBudget()) {
    report.memory_used = budget->bytesInUse();
    report.memory_peak = budget->peakBytes();
    report.memory_budget = budget->budget();
  } else {
    report.memory_used = rss;
    report.memory_peak = rss_peak;
  }
  if (const auto world = worker_->world()) {
    report.link = world->cpuTransport();
    for (const auto& [op, stats] : world->stats())
      report.ops[op] = {stats.count, stats.bytes, stats.seconds};
  }
  report.generation = generation_;
  report.recoveries_total = recoveries_;
  report.last_agree_seconds = agree_seconds_;
  report.last_rebuild_seconds = rebuild_seconds_;
  report.lost = lost_;
  report.unix_time = observe::unixNow();
  sender_.send(observe::toJson(report));
}

void TrainMetrics::recovery(const runtime::RecoveryRecord& record) {
  generation_ = record.generation;
  ++recoveries_;
  agree_seconds_ = record.agree_seconds;
  rebuild_seconds_ = record.rebuild_seconds;
  for (int member : record.lost)
    if (std::find(lost_.begin(), lost_.end(), member) == lost_.end()) lost_.push_back(member);
  std::sort(lost_.begin(), lost_.end());
}

std::unique_ptr<observe::NodeMonitor> startTrainMonitor(int port, int node_rank) {
  observe::checkMetricsPort(port, static_cast<unsigned>(::geteuid()));
  observe::NodeMonitorOptions options;
  options.node = node_rank;
  options.port = port;
  auto monitor = std::make_unique<observe::NodeMonitor>(options);
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  std::cout << "chorus train: metrics on http://" << host << ":" << monitor->port()
            << "/metrics, live page on http://" << host << ":" << monitor->port() << "/"
            << std::endl;
  return monitor;
}

}  // namespace chorus::cli
