// The Python front's half of `chorus run --metrics-port` and `--trace`: what a chorus.DataParallel
// rank tells its node's agent after each step, and the timeline it records, exactly as a
// `chorus train` worker does (tools/chorus/train_metrics.h, TrainerHooks::trace): the same
// RankReport over the same node-local channel (observe/rank_report.h, metrics_channel.h), so the
// agent serves the same series, and the same trace part (observe/trace_recorder.h), which the
// agent merges into one timeline when the workers are done.
//
// The request comes from chorus run's agent through the worker's environment, read once by
// chorus.init (observe/run_observe.h); under another launcher from the user's CHORUS_METRICS_PORT
// and CHORUS_TRACE, with the node's socket that runtime::JobObservation found (the node's first
// rank serves in the agent's stead). DataParallelCore owns one when something was asked and
// tells it where a step begins and ends; it records spans of the compute phases, the bucket
// all-reduces, the step figures' exchange and the optimizer. Training thread only; the send
// never blocks a step (a report the agent cannot take at once is dropped, and the next one
// carries the same running totals). Non-copyable.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chorus/observe/metrics_channel.h"
#include "chorus/observe/run_observe.h"
#include "chorus/observe/trace_recorder.h"
#include "chorus/runtime/launch/worker.h"

namespace chorus::python {

struct StepFigures;

// What only the Python side knows of a step. Value type.
struct StepExtras {
  double lr = 0;            // the optimizer's first param group's learning rate
  double loss_scale = 0;    // the GradScaler's scale for the step (0: none)
  bool loss_known = false;  // chorus.step was given the rank's loss
};

class StepObserver {
 public:
  using Clock = observe::TraceRecorder::Clock;

  // Throws ConfigError when the agent's socket is not usable.
  StepObserver(std::shared_ptr<runtime::Worker> worker, const observe::ObserveRequest& request,
               std::int64_t global_batch);
  StepObserver(const StepObserver&) = delete;
  StepObserver& operator=(const StepObserver&) = delete;

  // The recorder while the current step is in the trace's range, else null (callers skip their
  // timestamps then).
  observe::TraceRecorder* trace() const { return recording_ ? trace_.get() : nullptr; }
  // The step `step` begins (its first forward). Its time runs from the end of the previous step,
  // so that it includes the data loading between steps, or from now for the first step.
  void beginStep(std::int64_t step);
  // The step's figures were exchanged (DataParallelCore::finishStep): kept for its report.
  void figuresExchanged(const StepFigures& figures);
  // The step ended, after the optimizer (chorus.step): records the optimizer's span, sends the
  // report and writes this rank's trace part once the last traced step ended.
  void endStep(const StepExtras& extras);
  // An elastic recovery: the reports after it carry its generation, times and the launch ranks
  // lost so far; the next step's time counts from its first forward.
  void recovery(int generation, double agree_seconds, double rebuild_seconds,
                const std::vector<int>& lost);
  // Writes the trace part when it holds spans not written yet (the process ends before the
  // trace's last step).
  void flush();

 private:
  void send(const StepFigures& figures, const StepExtras& extras, double step_seconds);
  void writeTrace();

  std::shared_ptr<runtime::Worker> worker_;
  std::int64_t global_batch_;
  int node_;  // the node the reports and the trace name (ObserveRequest::node)
  std::unique_ptr<observe::MetricsSender> sender_;  // null: no metrics asked
  std::unique_ptr<observe::TraceRecorder> trace_;   // null: no trace asked
  std::string trace_path_;
  observe::TraceSteps trace_steps_;
  bool recording_ = false;
  bool written_ = false;  // the trace part holds every recorded span
  std::optional<Clock::time_point> last_end_;
  Clock::time_point step_start_;
  Clock::time_point exchanged_at_;
  std::unique_ptr<StepFigures> figures_;  // of the step in progress, once exchanged
  std::uint64_t skipped_ = 0;
  std::uint64_t rebalances_ = 0;
  int generation_ = 0;
  std::uint64_t recoveries_ = 0;
  double agree_seconds_ = 0;
  double rebuild_seconds_ = 0;
  std::vector<int> lost_;  // ascending, cumulative
};

}  // namespace chorus::python
