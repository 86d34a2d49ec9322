// How `chorus run` asks its workers for metrics and a timeline (observe/run_observe.h).
#include "chorus/observe/run_observe.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "chorus/core/error.h"

namespace chorus::observe {

std::map<std::string, std::string> observeEnvironment(const ObserveRequest& request) {
  std::map<std::string, std::string> environment;
  if (!request.metrics_socket.empty()) environment[kMetricsSocketVariable] = request.metrics_socket;
  if (!request.trace.empty()) {
    environment[kTraceVariable] = request.trace;
    environment[kTraceStepsVariable] =
        std::to_string(request.trace_steps.first) + ":" + std::to_string(request.trace_steps.end);
  }
  return environment;
}

ObserveRequest observeRequestFromEnvironment(const std::map<std::string, std::string>& environment,
                                             const std::string& launcher) {
  const auto value = [&environment](const char* name) {
    const auto found = environment.find(name);
    return found == environment.end() ? std::string() : found->second;
  };
  ObserveRequest request;
  request.metrics_socket = value(kMetricsSocketVariable);
  request.trace = value(kTraceVariable);
  const std::string port = value(kMetricsPortVariable);
  const std::string steps = value(kTraceStepsVariable);
  if (request.metrics_socket.empty() && request.trace.empty() && port.empty() && steps.empty())
    return request;
  const bool agent = launcher == "chorus";
  // The agent's socket outside its workers: metrics nobody serves would be silently lost.
  CHORUS_CHECK_CONFIG(agent || request.metrics_socket.empty(), kMetricsSocketVariable,
                      " is set by `chorus run --metrics-port` for its workers, but this process "
                      "was started by ",
                      launcher == "none" ? "no launcher" : launcher,
                      ": no chorus agent serves its metrics there; unset it and set ",
                      kMetricsPortVariable,
                      "=PORT instead (each node's first rank then serves its node's metrics), "
                      "or start the job with `chorus run --metrics-port PORT`");
  CHORUS_CHECK_CONFIG(!agent || port.empty(), kMetricsPortVariable, "=", port,
                      " is for a job that mpirun, srun or torchrun starts; under `chorus run` its "
                      "agent serves the node's metrics: give `chorus run --metrics-port ",
                      port, "` instead");
  if (!port.empty()) {
    try {
      size_t used = 0;
      request.metrics_port = std::stoi(port, &used);
      if (used != port.size()) request.metrics_port = -1;
    } catch (const std::logic_error&) {
      request.metrics_port = -1;
    }
    CHORUS_CHECK_CONFIG(request.metrics_port >= 0 && request.metrics_port <= 65535,
                        "environment variable ", kMetricsPortVariable, "='", port,
                        "' is not a port (0..65535; 0 picks a free one)");
  }
  CHORUS_CHECK_CONFIG(steps.empty() || !request.trace.empty(), kTraceStepsVariable, "=", steps,
                      " needs ", kTraceVariable, "=FILE (the trace it limits)");
  if (!steps.empty()) request.trace_steps = parseTraceSteps(steps);
  return request;
}

std::vector<std::string> traceParts(const std::string& trace) {
  const std::filesystem::path path(trace);
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : ".";
  const std::string prefix = path.filename().string() + ".rank";
  std::vector<std::string> parts;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > prefix.size() && name.rfind(prefix, 0) == 0 &&
        name.find_first_not_of("0123456789", prefix.size()) == std::string::npos)
      parts.push_back(entry.path().string());
  }
  std::sort(parts.begin(), parts.end());
  return parts;
}

void removeTraceParts(const std::string& trace) {
  for (const std::string& part : traceParts(trace)) std::remove(part.c_str());
}

int mergeTraceOf(const std::string& trace) {
  const std::vector<std::string> parts = traceParts(trace);
  if (parts.empty()) return 0;
  const int merged = mergeTraceParts(parts, trace);
  for (const std::string& part : parts) std::remove(part.c_str());
  return merged;
}

}  // namespace chorus::observe
