#include "chorus/observe/node_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>

namespace chorus::observe {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;
using prometheus::Labels;

struct NodeMetrics::Families {
  explicit Families(prometheus::Registry& r)
      : info(gauge(r, "chorus_rank_info", "1 per rank: its device and whether it is emulated")),
        step_seconds(BuildHistogram()
                         .Name("chorus_step_seconds")
                         .Help("Wall time of a training step on the rank")
                         .Register(r)),
        steps(counter(r, "chorus_steps_total", "Training steps the rank finished")),
        samples_per_second(gauge(r, "chorus_samples_per_second",
                                 "Samples of the global batch per second in the last step")),
        global_batch(gauge(r, "chorus_global_batch_samples", "Samples per global batch (B)")),
        share(gauge(r, "chorus_share_samples", "Samples of the global batch the rank takes")),
        compute(gauge(r, "chorus_compute_seconds",
                      "Compute time of the rank's last step, emulation padding included")),
        wait(gauge(r, "chorus_wait_seconds",
                   "Time the rank's last step waited for the gradient all-reduce")),
        compute_total(counter(r, "chorus_compute_seconds_total",
                              "Compute time of the rank, emulation padding included")),
        wait_total(counter(r, "chorus_wait_seconds_total",
                           "Time the rank waited for gradient all-reduces")),
        pad_total(counter(r, "chorus_pad_seconds_total",
                          "Time an emulated device slept to run at its emulated speed")),
        utilization(gauge(r, "chorus_device_utilization_ratio",
                          "Busy fraction of the rank's last step: compute / step time")),
        loss(gauge(r, "chorus_loss", "Mean training loss over the last global batch")),
        learning_rate(gauge(r, "chorus_learning_rate", "Learning rate of the last step")),
        loss_scale(gauge(r, "chorus_loss_scale", "The rank's loss scale (0: not scaled)")),
        test_accuracy(gauge(r, "chorus_test_accuracy_ratio", "Accuracy at the last evaluation")),
        skipped(counter(r, "chorus_skipped_steps_total", "Steps skipped on gradient overflow")),
        rebalances(counter(r, "chorus_balancer_changes_total",
                           "Steps after which the load balancer changed the shares")),
        memory_used(gauge(r, "chorus_memory_used_bytes", "Device memory held by tensors")),
        memory_reserved(gauge(r, "chorus_memory_reserved_bytes",
                              "Device memory the rank's process holds (CPU: resident set)")),
        memory_peak(gauge(r, "chorus_memory_peak_bytes", "Peak of chorus_memory_used_bytes")),
        memory_budget(gauge(r, "chorus_memory_budget_bytes",
                            "The rank's memory budget (absent without one)")),
        comm_bytes(counter(r, "chorus_collective_bytes_total",
                           "Payload bytes the rank handed to collective operations")),
        comm_ops(counter(r, "chorus_collective_operations_total", "Collective operations")),
        comm_seconds(counter(r, "chorus_collective_seconds_total",
                             "Time from each collective call until its wait() returned")),
        last_report(gauge(r, "chorus_rank_last_report_timestamp_seconds",
                          "When the rank last reported to its agent (Unix time)")),
        dropped(counter(r, "chorus_metrics_reports_dropped_total",
                        "Reports of the rank its agent's queue could not take (metrics only)")),
        generation(gauge(r, "chorus_elastic_generation",
                         "Elastic generation of the job (0 before any recovery)")),
        recoveries(
            counter(r, "chorus_elastic_recoveries_total", "Elastic recoveries from lost workers")),
        recovery_seconds(gauge(r, "chorus_elastic_recovery_seconds",
                               "Phase of the last elastic recovery: agree (from the failure to "
                               "the agreed membership) or rebuild (communicator, state, engine)")),
        lost_ranks(gauge(r, "chorus_elastic_lost_ranks", "Launch ranks lost from the job")),
        gpu_info(gauge(r, "chorus_gpu_info", "1 per GPU of the node: its name and PCI address")),
        gpu_utilization(gauge(r, "chorus_gpu_utilization_ratio",
                              "Fraction of NVML's last sample period in which a kernel ran")),
        gpu_memory_used(
            gauge(r, "chorus_gpu_memory_used_bytes", "GPU memory in use by all processes (NVML)")),
        gpu_memory_total(gauge(r, "chorus_gpu_memory_total_bytes", "GPU memory (NVML)")),
        gpu_power(gauge(r, "chorus_gpu_power_watts", "GPU power draw (NVML)")) {}

  static Family<Gauge>& gauge(prometheus::Registry& r, const char* name, const char* help) {
    return BuildGauge().Name(name).Help(help).Register(r);
  }
  static Family<Counter>& counter(prometheus::Registry& r, const char* name, const char* help) {
    return BuildCounter().Name(name).Help(help).Register(r);
  }

  Family<Gauge>& info;
  Family<Histogram>& step_seconds;
  Family<Counter>& steps;
  Family<Gauge>& samples_per_second;
  Family<Gauge>& global_batch;
  Family<Gauge>& share;
  Family<Gauge>& compute;
  Family<Gauge>& wait;
  Family<Counter>& compute_total;
  Family<Counter>& wait_total;
  Family<Counter>& pad_total;
  Family<Gauge>& utilization;
  Family<Gauge>& loss;
  Family<Gauge>& learning_rate;
  Family<Gauge>& loss_scale;
  Family<Gauge>& test_accuracy;
  Family<Counter>& skipped;
  Family<Counter>& rebalances;
  Family<Gauge>& memory_used;
  Family<Gauge>& memory_reserved;
  Family<Gauge>& memory_peak;
  Family<Gauge>& memory_budget;
  Family<Counter>& comm_bytes;
  Family<Counter>& comm_ops;
  Family<Counter>& comm_seconds;
  Family<Gauge>& last_report;
  Family<Counter>& dropped;
  Family<Gauge>& generation;
  Family<Counter>& recoveries;
  Family<Gauge>& recovery_seconds;
  Family<Gauge>& lost_ranks;
  Family<Gauge>& gpu_info;
  Family<Gauge>& gpu_utilization;
  Family<Gauge>& gpu_memory_used;
  Family<Gauge>& gpu_memory_total;
  Family<Gauge>& gpu_power;
};

namespace {

// Step times from 1 ms to about 65 s, doubling.
prometheus::Histogram::BucketBoundaries stepBuckets() {
  prometheus::Histogram::BucketBoundaries bounds;
  for (double bound = 0.001; bound < 70; bound *= 2) bounds.push_back(bound);
  return bounds;
}

// How much a running total grew since `previous`; a total that went down (the rank restarted)
// counts from zero again.
double growth(double total, double previous) {
  return total >= previous ? total - previous : total;
}

// The labels of a rank's own series: `rank` is its launch rank, which it keeps through elastic
// recoveries (its current rank changes when a lower one is lost).
Labels rankLabels(const RankReport& report, const std::string& node) {
  return {{"rank", std::to_string(report.member)}, {"device", report.device}, {"node", node}};
}

Labels opLabels(const RankReport& report, const std::string& node, const std::string& op) {
  Labels labels = rankLabels(report, node);
  labels["op"] = op;
  labels["link"] = report.link;
  return labels;
}

Labels gpuLabels(const GpuReading& gpu, const std::string& node) {
  return {{"node", node}, {"gpu", std::to_string(gpu.index)}};
}

Labels gpuInfoLabels(const GpuReading& gpu, const std::string& node) {
  Labels labels = gpuLabels(gpu, node);
  labels["name"] = gpu.name;
  labels["pci"] = gpu.pci;
  return labels;
}

// Removes the series of `labels` from `family` if it has one.
template <typename T, typename... Args>
void removeSeries(Family<T>& family, const Labels& labels, Args&&... args) {
  if (family.Has(labels)) family.Remove(&family.Add(labels, std::forward<Args>(args)...));
}

}  // namespace

NodeMetrics::NodeMetrics(int node)
    : node_(node),
      registry_(std::make_shared<prometheus::Registry>()),
      families_(std::make_unique<Families>(*registry_)) {}

NodeMetrics::~NodeMetrics() = default;

void NodeMetrics::update(const RankReport& report) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (lost_.count(report.member)) return;  // left out of the job: no longer one of its ranks
  for (int member : report.lost) {
    if (!lost_.insert(member).second) continue;
    const auto gone = last_.find(member);
    if (gone == last_.end()) continue;  // a rank of another node
    removeRankLocked(gone->second);
    last_.erase(gone);
  }
  Families& f = *families_;
  const std::string node = std::to_string(node_);
  const Labels rank = rankLabels(report, node);
  const Labels job = {{"node", node}};
  const auto found = last_.find(report.member);
  const RankReport previous = found == last_.end() ? RankReport{} : found->second;
  const bool first = found == last_.end();
  const int lowest = last_.empty() ? report.member : std::min(last_.begin()->first, report.member);

  Labels info = rank;
  info["emulated"] = report.emulated ? "true" : "false";
  f.info.Add(info).Set(1);
  f.step_seconds.Add(rank, stepBuckets()).Observe(report.step_seconds);
  f.steps.Add(rank).Increment(
      growth(static_cast<double>(report.step), first ? 0.0 : static_cast<double>(previous.step)));
  f.share.Add(rank).Set(static_cast<double>(report.share));
  f.compute.Add(rank).Set(report.compute_seconds);
  f.wait.Add(rank).Set(report.wait_seconds);
  f.compute_total.Add(rank).Increment(report.compute_seconds);
  f.wait_total.Add(rank).Increment(report.wait_seconds);
  f.pad_total.Add(rank).Increment(growth(report.pad_seconds_total, previous.pad_seconds_total));
  f.utilization.Add(rank).Set(report.utilization());
  f.loss_scale.Add(rank).Set(report.loss_scale);
  f.memory_used.Add(rank).Set(static_cast<double>(report.memory_used));
  f.memory_reserved.Add(rank).Set(static_cast<double>(report.memory_reserved));
  f.memory_peak.Add(rank).Set(static_cast<double>(report.memory_peak));
  if (report.memory_budget > 0)
    f.memory_budget.Add(rank).Set(static_cast<double>(report.memory_budget));
  f.last_report.Add(rank).Set(report.unix_time);
  f.dropped.Add(rank).Increment(growth(static_cast<double>(report.dropped_reports_total),
                                       static_cast<double>(previous.dropped_reports_total)));
  for (const auto& [op, totals] : report.ops) {
    const Labels labels = opLabels(report, node, op);
    const auto before = previous.ops.find(op);
    const OpTotals was = before == previous.ops.end() ? OpTotals{} : before->second;
    f.comm_bytes.Add(labels).Increment(
        growth(static_cast<double>(totals.bytes), static_cast<double>(was.bytes)));
    f.comm_ops.Add(labels).Increment(
        growth(static_cast<double>(totals.count), static_cast<double>(was.count)));
    f.comm_seconds.Add(labels).Increment(growth(totals.seconds, was.seconds));
  }
  if (report.member == lowest) {
    f.samples_per_second.Add(job).Set(report.samples_per_second);
    f.global_batch.Add(job).Set(static_cast<double>(report.global_batch));
    if (report.loss_known) f.loss.Add(job).Set(report.loss);
    f.learning_rate.Add(job).Set(report.lr);
    if (report.test_accuracy) f.test_accuracy.Add(job).Set(*report.test_accuracy);
    f.skipped.Add(job).Increment(growth(static_cast<double>(report.skipped_steps_total),
                                        static_cast<double>(previous.skipped_steps_total)));
    f.rebalances.Add(job).Increment(growth(static_cast<double>(report.rebalances_total),
                                           static_cast<double>(previous.rebalances_total)));
    f.generation.Add(job).Set(report.generation);
    f.recoveries.Add(job).Increment(growth(static_cast<double>(report.recoveries_total),
                                           static_cast<double>(previous.recoveries_total)));
    f.lost_ranks.Add(job).Set(static_cast<double>(report.lost.size()));
    if (report.recoveries_total > 0) {
      f.recovery_seconds.Add({{"node", node}, {"phase", "agree"}}).Set(report.last_agree_seconds);
      f.recovery_seconds.Add({{"node", node}, {"phase", "rebuild"}})
          .Set(report.last_rebuild_seconds);
    }
  }
  last_[report.member] = report;
  ++reports_;
}

void NodeMetrics::removeRankLocked(const RankReport& last) {
  Families& f = *families_;
  const std::string node = std::to_string(node_);
  const Labels rank = rankLabels(last, node);
  Labels info = rank;
  info["emulated"] = last.emulated ? "true" : "false";
  removeSeries(f.info, info);
  removeSeries(f.step_seconds, rank, stepBuckets());
  for (Family<Counter>* family :
       {&f.steps, &f.compute_total, &f.wait_total, &f.pad_total, &f.dropped})
    removeSeries(*family, rank);
  for (Family<Gauge>* family :
       {&f.share, &f.compute, &f.wait, &f.utilization, &f.loss_scale, &f.memory_used,
        &f.memory_reserved, &f.memory_peak, &f.memory_budget, &f.last_report})
    removeSeries(*family, rank);
  for (const auto& [op, totals] : last.ops)
    for (Family<Counter>* family : {&f.comm_bytes, &f.comm_ops, &f.comm_seconds})
      removeSeries(*family, opLabels(last, node, op));
}

void NodeMetrics::updateGpus(const std::vector<GpuReading>& readings) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Gauges keep no history, so every series of the last readings goes and these are set anew:
  // what they no longer report leaves the exposition.
  for (const GpuReading& last : gpus_) removeGpuLocked(last);
  Families& f = *families_;
  const std::string node = std::to_string(node_);
  for (const GpuReading& gpu : readings) {
    const Labels labels = gpuLabels(gpu, node);
    f.gpu_info.Add(gpuInfoLabels(gpu, node)).Set(1);
    if (gpu.utilization) f.gpu_utilization.Add(labels).Set(*gpu.utilization);
    if (gpu.memory_used_bytes)
      f.gpu_memory_used.Add(labels).Set(static_cast<double>(*gpu.memory_used_bytes));
    if (gpu.memory_total_bytes)
      f.gpu_memory_total.Add(labels).Set(static_cast<double>(*gpu.memory_total_bytes));
    if (gpu.power_watts) f.gpu_power.Add(labels).Set(*gpu.power_watts);
  }
  gpus_ = readings;
}

void NodeMetrics::removeGpuLocked(const GpuReading& last) {
  Families& f = *families_;
  const std::string node = std::to_string(node_);
  removeSeries(f.gpu_info, gpuInfoLabels(last, node));
  for (Family<Gauge>* family :
       {&f.gpu_utilization, &f.gpu_memory_used, &f.gpu_memory_total, &f.gpu_power})
    removeSeries(*family, gpuLabels(last, node));
}

std::string NodeMetrics::exposition() const {
  // Collect() is thread-safe in prometheus-cpp; the lock keeps a scrape from seeing half an
  // update.
  std::lock_guard<std::mutex> lock(mutex_);
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

long NodeMetrics::reports() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reports_;
}

}  // namespace chorus::observe
