#include "chorus/observe/trace_recorder.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chorus/core/error.h"

namespace chorus::observe {
namespace {

using Json = nlohmann::json;

// Microseconds on the monotonic clock: the trace-event format's unit.
double micros(TraceRecorder::Clock::time_point point) {
  return std::chrono::duration<double, std::micro>(point.time_since_epoch()).count();
}

int trackId(int rank, Track track) { return 2 * rank + (track == Track::kComm ? 1 : 0); }

Json metadata(const char* name, int node, int tid, Json args) {
  return Json{{"ph", "M"}, {"name", name}, {"pid", node}, {"tid", tid}, {"args", std::move(args)}};
}

std::int64_t parseStep(const std::string& text, const std::string& whole) {
  std::size_t used = 0;
  long long value = -1;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  CHORUS_CHECK_CONFIG(used == text.size() && !text.empty() && value >= 0,
                      "--trace-steps: expected A:B with steps 0 <= A < B, got '", whole, "'");
  return value;
}

void writeFile(const std::string& path, const std::string& text) {
  const std::string temporary = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    CHORUS_CHECK_CONFIG(out.good(), "trace: cannot write '", path, "'");
    out << text;
    out.flush();
    CHORUS_CHECK_CONFIG(out.good(), "trace: cannot write '", path, "'");
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    CHORUS_THROW(ConfigError, "trace: cannot write '", path, "'");
  }
}

}  // namespace

TraceSteps parseTraceSteps(const std::string& text) {
  const std::size_t colon = text.find(':');
  CHORUS_CHECK_CONFIG(colon != std::string::npos,
                      "--trace-steps: expected A:B with steps 0 <= A < B, got '", text, "'");
  TraceSteps steps;
  steps.first = parseStep(text.substr(0, colon), text);
  steps.end = parseStep(text.substr(colon + 1), text);
  CHORUS_CHECK_CONFIG(steps.end > steps.first,
                      "--trace-steps: expected A:B with steps 0 <= A < B, got '", text, "'");
  return steps;
}

TraceRecorder::TraceRecorder(int rank, int node, std::string label, TraceSteps steps)
    : rank_(rank), node_(node), label_(std::move(label)), steps_(steps) {}

void TraceRecorder::setStep(std::int64_t step) {
  std::lock_guard<std::mutex> lock(mutex_);
  step_ = step;
}

bool TraceRecorder::recording() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return step_ >= steps_.first && step_ < steps_.end;
}

void TraceRecorder::span(Track track, std::string name, std::string category,
                         Clock::time_point start, Clock::time_point end) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (step_ < steps_.first || step_ >= steps_.end) return;
  spans_.push_back(
      {track, std::move(name), std::move(category), step_, start, std::max(start, end)});
}

std::vector<TraceSpan> TraceRecorder::spans() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return spans_;
}

std::string TraceRecorder::partJson() const {
  Json events = Json::array();
  for (Track track : {Track::kCompute, Track::kComm}) {
    const int tid = trackId(rank_, track);
    const std::string suffix = track == Track::kComm ? " comm" : "";
    events.push_back(metadata("thread_name", node_, tid, {{"name", label_ + suffix}}));
    events.push_back(metadata("thread_sort_index", node_, tid, {{"sort_index", tid}}));
  }
  for (const TraceSpan& span : spans()) {
    events.push_back({{"ph", "X"},
                      {"name", span.name},
                      {"cat", span.category},
                      {"pid", node_},
                      {"tid", trackId(rank_, span.track)},
                      {"ts", micros(span.start)},
                      {"dur", micros(span.end) - micros(span.start)},
                      {"args", {{"step", span.step}, {"rank", rank_}}}});
  }
  return events.dump();
}

void TraceRecorder::writePart(const std::string& path) const { writeFile(path, partJson()); }

std::string tracePartPath(const std::string& path, int rank) {
  return path + ".rank" + std::to_string(rank);
}

int mergeTraceParts(const std::vector<std::string>& parts, const std::string& path) {
  Json events = Json::array();
  double origin = std::numeric_limits<double>::infinity();
  std::vector<int> nodes;
  for (const std::string& part : parts) {
    std::ifstream in(part, std::ios::binary);
    CHORUS_CHECK_CONFIG(in.good(), "trace: cannot read the part '", part, "'");
    std::stringstream text;
    text << in.rdbuf();
    Json loaded = Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
    CHORUS_CHECK_CONFIG(loaded.is_array(), "trace: the part '", part, "' is not a JSON array");
    for (Json& event : loaded) {
      CHORUS_CHECK_CONFIG(event.is_object() && event.contains("ph") && event.contains("pid"),
                          "trace: the part '", part, "' holds an event that is not one");
      if (event["ph"] == "X") origin = std::min(origin, event.value("ts", origin));
      const int node = event["pid"].get<int>();
      if (std::find(nodes.begin(), nodes.end(), node) == nodes.end()) nodes.push_back(node);
      events.push_back(std::move(event));
    }
  }
  if (!std::isfinite(origin)) origin = 0;
  for (Json& event : events)
    if (event["ph"] == "X") event["ts"] = event["ts"].get<double>() - origin;
  std::sort(nodes.begin(), nodes.end());
  for (int node : nodes)
    events.push_back(metadata("process_name", node, 0, {{"name", "node " + std::to_string(node)}}));
  const Json trace = {
      {"traceEvents", events},
      {"displayTimeUnit", "ms"},
      {"otherData", {{"generator", "chorus train --trace"}, {"ranks", parts.size()}}}};
  writeFile(path, trace.dump());
  return static_cast<int>(parts.size());
}

void checkTraceWritable(const std::string& path) {
  CHORUS_CHECK_CONFIG(!path.empty(), "--trace: the path is empty");
  const bool existed = ::access(path.c_str(), F_OK) == 0;
  std::FILE* probe = std::fopen(path.c_str(), "ab");
  CHORUS_CHECK_CONFIG(probe != nullptr, "--trace: cannot write '", path, "'");
  std::fclose(probe);
  // Only what the probe created goes: an existing file is overwritten by the job, not now.
  if (!existed) std::remove(path.c_str());
}

}  // namespace chorus::observe
