// A timeline of real training steps: spans of what each rank did (forward, backward, padding,
// each gradient bucket's all-reduce, the optimizer, ...) written as Chrome trace-event JSON, the
// format of `chorus simulate --trace`, so that a plan's prediction and its real run open side by
// side in Perfetto or chrome://tracing.
//
// Times come from the host's monotonic clock (std::chrono::steady_clock, CLOCK_MONOTONIC on
// Linux), which every process on one host shares: the ranks of one host line up without any
// exchange. Ranks on different hosts are not aligned (each host's clock starts at its boot).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace chorus::observe {

// Which of a rank's two tracks a span goes on (as in the simulator's trace).
enum class Track { kCompute, kComm };

// One recorded span. Value type.
struct TraceSpan {
  Track track = Track::kCompute;
  std::string name;      // e.g. "forward", "all_reduce bucket 2"
  std::string category;  // e.g. "compute", "pad", "allreduce", "optimizer"
  std::int64_t step = 0;
  std::chrono::steady_clock::time_point start;
  std::chrono::steady_clock::time_point end;
};

// The steps a trace covers: [first, end). Value type. Default: the first 20 steps.
struct TraceSteps {
  std::int64_t first = 0;
  std::int64_t end = 20;
};

// Parses "A:B" (steps A to B - 1). Throws ConfigError on anything else (B <= A, negatives).
TraceSteps parseTraceSteps(const std::string& text);

// Records one rank's spans for the steps of a TraceSteps range, in memory, and writes them.
//
// Bounded: spans outside the range are dropped at once (setStep() decides), so a long job's
// trace holds only the steps asked for. Thread-safe: span() may be called from any thread (a
// backward hook, a communication thread); setStep() and write() from the training thread.
class TraceRecorder {
 public:
  using Clock = std::chrono::steady_clock;

  // `node`: the host's index (the trace's process); `label`: how the rank's tracks are named,
  // e.g. "rank 1 (cpu@0.5)".
  TraceRecorder(int rank, int node, std::string label, TraceSteps steps);

  // The step whose spans follow; spans are kept only while it is inside the range.
  void setStep(std::int64_t step);
  // Whether the current step is recorded: callers skip taking timestamps otherwise.
  bool recording() const;
  void span(Track track, std::string name, std::string category, Clock::time_point start,
            Clock::time_point end);
  std::vector<TraceSpan> spans() const;

  // This rank's part of a trace: its track names and spans, as a JSON array of trace events.
  std::string partJson() const;
  // Writes partJson() to `path` (through a temporary file and a rename). Throws ConfigError when
  // the file cannot be written.
  void writePart(const std::string& path) const;

 private:
  const int rank_;
  const int node_;
  const std::string label_;
  const TraceSteps steps_;
  std::int64_t step_ = -1;
  mutable std::mutex mutex_;
  std::vector<TraceSpan> spans_;
};

// The path of rank `rank`'s part of the trace `path`: "<path>.rank<rank>".
std::string tracePartPath(const std::string& path, int rank);
// Merges the parts (partJson() files) into one Chrome trace-event JSON object at `path`, with
// one process per node and two tracks (compute, communication) per rank; timestamps are made
// relative to the earliest span. Returns the number of parts merged. Throws ConfigError when a
// part cannot be read or parsed, or the trace cannot be written.
int mergeTraceParts(const std::vector<std::string>& parts, const std::string& path);
// Throws ConfigError unless a file can be created at `path` (checked before a job starts, so a
// bad --trace path fails at once rather than after training). Leaves no file behind.
void checkTraceWritable(const std::string& path);

}  // namespace chorus::observe
