// A Python rank's reports and timeline for `chorus run --metrics-port/--trace` (step_observer.h).
#include "step_observer.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "chorus/device/memory_budget.h"
#include "chorus/device/speed_emulator.h"
#include "chorus/observe/node_monitor.h"
#include "chorus/observe/rank_report.h"
#include "data_parallel_core.h"

namespace chorus::python {
namespace {

template <typename T>
T at(const std::vector<T>& values, int rank) {
  return rank >= 0 && static_cast<size_t>(rank) < values.size() ? values[rank] : T{};
}

}  // namespace

StepObserver::StepObserver(std::shared_ptr<runtime::Worker> worker,
                           const observe::ObserveRequest& request, std::int64_t global_batch)
    : worker_(std::move(worker)),
      global_batch_(global_batch),
      node_(request.node >= 0 ? request.node : worker_->identity().node_rank) {
  if (!request.metrics_socket.empty())
    sender_ = std::make_unique<observe::MetricsSender>(request.metrics_socket);
  if (!request.trace.empty()) {
    // Named by the launch rank, which a worker keeps through elastic recoveries: no two parts
    // of one job share a path.
    const int member = worker_->member();
    const auto& identity = worker_->identity();
    trace_path_ = observe::tracePartPath(request.trace, member);
    trace_steps_ = request.trace_steps;
    trace_ = std::make_unique<observe::TraceRecorder>(
        member, node_, "rank " + std::to_string(member) + " (" + identity.device.toString() + ")",
        request.trace_steps);
  }
}

void StepObserver::beginStep(std::int64_t step) {
  step_start_ = last_end_ ? *last_end_ : Clock::now();
  figures_.reset();
  if (!trace_) return;
  trace_->setStep(step);
  recording_ = trace_->recording();
  if (recording_) written_ = false;
}

void StepObserver::figuresExchanged(const StepFigures& figures) {
  exchanged_at_ = Clock::now();
  figures_ = std::make_unique<StepFigures>(figures);
}

void StepObserver::endStep(const StepExtras& extras) {
  if (!figures_) return;  // no step was exchanged since the last report
  const auto now = Clock::now();
  if (observe::TraceRecorder* recorder = trace())
    recorder->span(observe::Track::kCompute, "optimizer", "optimizer", exchanged_at_, now);
  const double step_seconds = std::chrono::duration<double>(now - step_start_).count();
  last_end_ = now;
  if (figures_->overflow) ++skipped_;
  if (!figures_->rebalance.empty()) ++rebalances_;
  if (sender_) send(*figures_, extras, step_seconds);
  const std::int64_t step = figures_->step;
  figures_.reset();
  recording_ = false;
  // The part is written as soon as the range is recorded, not at exit: a worker that is killed
  // later (a stopped job) still leaves its timeline.
  if (trace_ && !written_ && step + 1 >= trace_steps_.end) writeTrace();
}

void StepObserver::send(const StepFigures& figures, const StepExtras& extras, double step_seconds) {
  const int rank = worker_->rank();
  const auto& identity = worker_->identity();
  observe::RankReport report;
  report.rank = rank;
  report.member = worker_->member();
  report.node = node_;
  report.device = identity.device.toString();
  report.emulated = identity.device.emulated();
  report.step = figures.step + 1;
  report.global_batch = global_batch_;
  report.share = at(figures.samples, rank);
  report.step_seconds = step_seconds;
  report.samples_per_second = step_seconds > 0 ? global_batch_ / step_seconds : 0;
  report.compute_seconds = at(figures.compute_seconds, rank);
  report.wait_seconds = at(figures.wait_seconds, rank);
  report.pad_seconds_total = worker_->emulator().totals().padded_seconds;
  report.loss = extras.loss_known ? figures.loss : 0;
  report.loss_known = extras.loss_known;
  report.lr = extras.lr;
  report.loss_scale = extras.loss_scale;
  report.skipped_steps_total = skipped_;
  report.rebalances_total = rebalances_;
  report.dropped_reports_total = static_cast<std::uint64_t>(sender_->dropped());
  const auto [rss, rss_peak] = observe::processResidentSet();
  report.memory_reserved = rss;
  const auto gpu = identity.device.kind == DeviceKind::kCuda
                       ? device::cudaMemoryFigures(identity.device.index)
                       : std::nullopt;
  if (gpu) {
    // A GPU rank's memory is its device's, as libtorch's caching allocator holds it.
    report.memory_used = gpu->allocated;
    report.memory_reserved = gpu->reserved;
    report.memory_peak = gpu->allocated_peak;
    report.memory_budget = identity.device.memory_budget.value_or(0);
  } else if (const auto budget = worker_->memoryBudget()) {
    report.memory_used = budget->bytesInUse();
    report.memory_peak = budget->peakBytes();
    report.memory_budget = budget->budget();
  } else {
    // The Python front does not enforce a CPU budget (docs/python.md): used is the resident set,
    // shown against the budget the device spec names.
    report.memory_used = rss;
    report.memory_peak = rss_peak;
    report.memory_budget = identity.device.memory_budget.value_or(0);
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
  sender_->send(observe::toJson(report));
}

void StepObserver::recovery(int generation, double agree_seconds, double rebuild_seconds,
                            const std::vector<int>& lost) {
  generation_ = generation;
  ++recoveries_;
  agree_seconds_ = agree_seconds;
  rebuild_seconds_ = rebuild_seconds;
  for (int member : lost)
    if (std::find(lost_.begin(), lost_.end(), member) == lost_.end()) lost_.push_back(member);
  std::sort(lost_.begin(), lost_.end());
  // The redone step's time starts at its forward, not at the step before the loss.
  last_end_.reset();
  figures_.reset();
  recording_ = false;
}

void StepObserver::flush() {
  if (trace_ && !written_ && !trace_->spans().empty()) writeTrace();
}

void StepObserver::writeTrace() {
  trace_->writePart(trace_path_);
  written_ = true;
}

}  // namespace chorus::python
