// What one worker tells its node's agent after each training step: its own share, times, memory
// and communication totals, and the job-wide figures of the step (loss, learning rate). The agent
// turns these into Prometheus metrics (node_metrics.h) and the live page's history
// (live_state.h). Sent as one JSON datagram over the node-local channel (metrics_channel.h),
// never over the training communicator.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace chorus::observe {

// Totals of one kind of collective operation on one rank since it started. Value type.
struct OpTotals {
  std::uint64_t count = 0;
  std::uint64_t bytes = 0;  // payload handed in by this rank (comm::OpStats::bytes)
  double seconds = 0;       // from each call until its wait() returned
};

// One rank after one step. Value type. Counters are running totals since the worker started (the
// agent turns them into Prometheus counters); the rest describe the step just finished.
struct RankReport {
  int rank = 0;    // the rank in the current generation's world
  int member = 0;  // the launch rank: names the worker for good, through elastic recoveries
  int node = 0;
  std::string device;  // the device spec, e.g. "cpu@0.5/512MiB"
  // speed < 1: the figures include padding (always labelled as such: docs/architecture.md,
  // "Emulated heterogeneity")
  bool emulated = false;
  std::int64_t step = 0;  // steps done, 1-based
  std::int64_t global_batch = 0;
  std::int64_t share = 0;  // samples of the global batch this rank took in the step
  double step_seconds = 0;
  double samples_per_second = 0;  // the job's: B / step time
  double compute_seconds = 0;     // padded compute of the step (what the balancer sees)
  double wait_seconds = 0;        // blocked on the gradient all-reduce
  double pad_seconds_total = 0;   // slept to emulate a slower device, since start
  double loss = 0;
  // Whether `loss` is the step's: a user's program under `chorus run` need not give one
  // (chorus.step without loss=); then there is no chorus_loss series. Default: true.
  bool loss_known = true;
  double lr = 0;
  double loss_scale = 0;  // 0: this rank does not scale its loss
  std::uint64_t skipped_steps_total = 0;
  std::uint64_t rebalances_total = 0;       // steps after which the balancer changed the shares
  std::uint64_t dropped_reports_total = 0;  // earlier reports the channel could not take
  std::optional<double> test_accuracy;
  // Memory of the rank's device in bytes: used by tensors, reserved by the process (on a CPU its
  // resident set), the peak of used, and the budget (0: none).
  std::uint64_t memory_used = 0;
  std::uint64_t memory_reserved = 0;
  std::uint64_t memory_peak = 0;
  std::uint64_t memory_budget = 0;
  std::string link;  // the transport of the rank's collectives: "shm", "gloo", "nccl"
  std::map<std::string, OpTotals> ops;
  double unix_time = 0;  // when the report was made (seconds since the epoch)
  // Elastic recovery (docs/elastic.md): the generation the step ran in (0 before any recovery),
  // the recoveries this worker took part in, the agreement and rebuild times of the last one,
  // and the launch ranks lost so far (cumulative, ascending).
  int generation = 0;
  std::uint64_t recoveries_total = 0;
  double last_agree_seconds = 0;
  double last_rebuild_seconds = 0;
  std::vector<int> lost;

  // Busy fraction of the step: compute / step time, in [0, 1].
  double utilization() const;
};

// The JSON form of a report (one datagram). fromJson throws ConfigError on a malformed report;
// it takes reports of older workers without `member` (then the rank) or the elastic fields (0).
// The process's resident set and its peak (VmRSS, VmHWM of /proc/self/status), in bytes: what a
// CPU rank reports as its memory (RankReport::memory_used, memory_peak); zeros where unreadable.
std::pair<std::uint64_t, std::uint64_t> processResidentSet();

std::string toJson(const RankReport& report);
RankReport rankReportFromJson(const std::string& text);

}  // namespace chorus::observe
