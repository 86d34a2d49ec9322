// Chrome trace-event JSON for a simulated step (the "JSON Object Format" of the Trace Event
// Format document; Perfetto and chrome://tracing read it). Times are microseconds.
#include <nlohmann/json.hpp>

#include "chorus/plan/simulator.h"

namespace chorus::plan {
namespace {

constexpr double kMicros = 1e6;

// Each rank has two tracks: compute, and communication (transfers, collectives).
int trackOf(int rank, const std::string& category) {
  return 2 * rank +
         (category == "p2p" || category == "allreduce" || category == "allgather" ? 1 : 0);
}

}  // namespace

std::string chromeTrace(const SimResult& result, const Plan& plan, const Cluster& cluster) {
  nlohmann::json events = nlohmann::json::array();
  for (size_t n = 0; n < cluster.nodes().size(); ++n)
    events.push_back({{"ph", "M"},
                      {"name", "process_name"},
                      {"pid", n},
                      {"args", {{"name", "node " + cluster.nodes()[n].name}}}});
  for (size_t rank = 0; rank < plan.ranks.size(); ++rank) {
    const Device& device = cluster.device(plan.ranks[rank].device);
    const std::string label = "rank " + std::to_string(rank) + " (" + device.type.name + ")";
    for (const char* suffix : {"", " comm"}) {
      const bool comm = *suffix != 0;
      events.push_back({{"ph", "M"},
                        {"name", "thread_name"},
                        {"pid", device.node},
                        {"tid", 2 * rank + (comm ? 1 : 0)},
                        {"args", {{"name", label + suffix}}}});
      events.push_back({{"ph", "M"},
                        {"name", "thread_sort_index"},
                        {"pid", device.node},
                        {"tid", 2 * rank + (comm ? 1 : 0)},
                        {"args", {{"sort_index", 2 * rank + (comm ? 1 : 0)}}}});
    }
  }
  for (const TraceSpan& span : result.spans) {
    const Device& device = cluster.device(plan.ranks[span.rank].device);
    events.push_back({{"ph", "X"},
                      {"name", span.name},
                      {"cat", span.category},
                      {"pid", device.node},
                      {"tid", trackOf(span.rank, span.category)},
                      {"ts", span.start * kMicros},
                      {"dur", span.duration * kMicros}});
  }
  nlohmann::json trace = {{"traceEvents", events},
                          {"displayTimeUnit", "ms"},
                          {"otherData",
                           {{"generator", "chorus simulate"},
                            {"plan", plan.summary()},
                            {"step_seconds", result.step_seconds},
                            {"bubble_fraction", result.bubble_fraction}}}};
  return trace.dump();
}

}  // namespace chorus::plan
