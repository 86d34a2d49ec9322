// The cost of metrics per step, measured directly: what a worker does after each step with
// --metrics-port (read /proc/self/status for its memory, serialize its RankReport, send it on
// the node-local socket) and what its agent does with it (parse, update the Prometheus registry
// and the live page's history), on a real NodeMonitor; plus one scrape of the exposition. Prints
// microseconds per step and the ratio to a given step time; JSON with --json. And the trace's
// cost per span (TraceRecorder::span while recording), to multiply by a step's spans.
//
//   build/bench/observe_bench [--reports 20000] [--ranks 3] [--step-ms 45] [--json]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "chorus/observe/metrics_channel.h"
#include "chorus/observe/node_monitor.h"
#include "chorus/observe/rank_report.h"
#include "chorus/observe/trace_recorder.h"

using chorus::observe::RankReport;
using Clock = std::chrono::steady_clock;

namespace {

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// What TrainMetrics reads per step (tools/chorus/train_metrics.cc).
std::uint64_t residentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  return 0;
}

RankReport report(int rank, std::int64_t step) {
  RankReport r;
  r.rank = rank;
  r.member = rank;
  r.device = rank == 0 ? "cpu" : "cpu@0.5/512MiB";
  r.step = step;
  r.global_batch = 64;
  r.share = 20 + rank;
  r.step_seconds = 0.045;
  r.compute_seconds = 0.03;
  r.wait_seconds = 0.01;
  r.link = "shm";
  for (const char* op : {"all_reduce", "all_gather", "broadcast"})
    r.ops[op] = {static_cast<std::uint64_t>(step), static_cast<std::uint64_t>(step) * 4096, 0.001};
  r.unix_time = chorus::observe::unixNow();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  long reports = 20000;
  int ranks = 3;
  double step_ms = 45;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reports") && i + 1 < argc) reports = std::atol(argv[++i]);
    if (!std::strcmp(argv[i], "--ranks") && i + 1 < argc) ranks = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--step-ms") && i + 1 < argc) step_ms = std::atof(argv[++i]);
    if (!std::strcmp(argv[i], "--json")) json = true;
  }
  chorus::observe::NodeMonitorOptions options;
  options.address = "127.0.0.1";
  chorus::observe::NodeMonitor monitor(options);
  chorus::observe::MetricsSender sender(monitor.socketPath());

  // Worker side, per step: memory, serialize, send. Paced so the agent keeps up (it would: a
  // real step is milliseconds), which also measures the agent's side below.
  double worker_seconds = 0;
  long sent = 0;
  const auto all = Clock::now();
  for (long i = 0; i < reports; ++i) {
    const auto start = Clock::now();
    RankReport r = report(static_cast<int>(i % ranks), i / ranks + 1);
    r.memory_used = residentBytes();
    sent += sender.send(chorus::observe::toJson(r)) ? 1 : 0;
    worker_seconds += secondsSince(start);
    while (monitor.metrics().reports() < sent - 4) std::this_thread::yield();
  }
  while (monitor.metrics().reports() < sent) std::this_thread::yield();
  const double total_seconds = secondsSince(all);

  // Agent side alone: parse + registry + history, on the same reports.
  chorus::observe::NodeMetrics metrics(0);
  chorus::observe::LiveState state(0);
  std::vector<std::string> texts;
  for (long i = 0; i < 1000; ++i)
    texts.push_back(chorus::observe::toJson(report(i % ranks, i / ranks + 1)));
  auto start = Clock::now();
  for (long i = 0; i < reports; ++i) {
    const RankReport r = chorus::observe::rankReportFromJson(texts[i % texts.size()]);
    metrics.update(r);
    state.update(r);
  }
  const double agent_seconds = secondsSince(start);
  start = Clock::now();
  size_t bytes = 0;
  for (int i = 0; i < 100; ++i) bytes = metrics.exposition().size();
  const double scrape_seconds = secondsSince(start) / 100;

  // The trace: one recorded span (what a traced step pays per forward, backward, bucket, ...).
  chorus::observe::TraceRecorder trace(0, 0, "rank 0 (cpu)", {0, 1 << 30});
  trace.setStep(0);
  constexpr long kSpans = 200000;
  start = Clock::now();
  for (long i = 0; i < kSpans; ++i) {
    const auto begin = Clock::now();
    trace.span(chorus::observe::Track::kCompute, "backward", "compute", begin, Clock::now());
  }
  const double span_us = secondsSince(start) / kSpans * 1e6;

  const double worker_us = worker_seconds / reports * 1e6;
  const double agent_us = agent_seconds / reports * 1e6;
  // Per step every rank pays its worker side; the agent handles `ranks` reports per step on the
  // same host's cores.
  const double per_step_us = worker_us + agent_us * ranks;
  const nlohmann::json result = {{"bench", "observe_bench"},
                                 {"reports", reports},
                                 {"ranks", ranks},
                                 {"delivered", monitor.metrics().reports()},
                                 {"worker_us_per_report", worker_us},
                                 {"agent_us_per_report", agent_us},
                                 {"end_to_end_us_per_report", total_seconds / reports * 1e6},
                                 {"scrape_ms", scrape_seconds * 1e3},
                                 {"exposition_bytes", bytes},
                                 {"trace_us_per_span", span_us},
                                 {"step_ms", step_ms},
                                 {"overhead_of_step", per_step_us / (step_ms * 1e3)}};
  if (json) {
    std::printf("%s\n", result.dump(2).c_str());
    return 0;
  }
  std::printf("worker side (memory + serialize + send): %.1f us per step\n", worker_us);
  std::printf("agent side (parse + registry + history): %.1f us per report, %d reports per step\n",
              agent_us, ranks);
  std::printf("end to end, paced: %.1f us per report, %ld of %ld delivered\n",
              total_seconds / reports * 1e6, monitor.metrics().reports(), reports);
  std::printf("one scrape: %.2f ms for %zu bytes of exposition\n", scrape_seconds * 1e3, bytes);
  std::printf("trace: %.3f us per recorded span (two clock reads included)\n", span_us);
  std::printf("per step, worker + agent for %d ranks: %.1f us = %.3f%% of a %.0f ms step\n", ranks,
              per_step_us, 100 * per_step_us / (step_ms * 1e3), step_ms);
  return 0;
}
