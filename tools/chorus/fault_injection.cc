#include "fault_injection.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <thread>

#include "chorus/core/error.h"
#include "chorus/core/logging.h"

namespace chorus::cli {
namespace {

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  std::string part;
  while (std::getline(stream, part, separator)) parts.push_back(part);
  return parts;
}

// TrainerHooks::at_point's points, and "join" (the CLI's, before a replacement asks to join).
constexpr std::array<const char*, 8> kPoints = {"forward", "reduce",  "optimizer",  "recovery",
                                                "regroup", "rebuild", "checkpoint", "join"};

bool knownPoint(const std::string& point) {
  return std::find(kPoints.begin(), kPoints.end(), point) != kPoints.end();
}

// "forward, reduce, ... or join".
std::string pointList() {
  std::string list;
  for (std::size_t i = 0; i < kPoints.size(); ++i)
    list += std::string(i == 0 ? "" : i + 1 == kPoints.size() ? " or " : ", ") + kPoints[i];
  return list;
}

// Fills `parsed`'s signal or slowness from FAULT.
void parseAction(const std::string& name, const std::string& fault, FaultInjection::Fault& parsed) {
  if (name == "KILL") {
    parsed.signal = SIGKILL;
  } else if (name == "STOP") {
    parsed.signal = SIGSTOP;
  } else if (name.rfind("SLOW", 0) == 0 && name.size() > 4 &&
             name.find_first_not_of("0123456789", 4) == std::string::npos && name.size() <= 10) {
    parsed.slow_ms = std::stoi(name.substr(4));
  } else {
    CHORUS_THROW(ConfigError, "CHORUS_FAULT: '", fault, "': the fault '", name,
                 "' is unknown; expected KILL, STOP or SLOW<ms>");
  }
}

}  // namespace

FaultInjection FaultInjection::parse(const std::string& text) {
  FaultInjection injection;
  for (const std::string& fault : split(text, ',')) {
    const std::vector<std::string> parts = split(fault, ':');
    if (parts.size() != 4)
      CHORUS_THROW(ConfigError, "CHORUS_FAULT: '", fault, "': expected RANK:POINT:STEP:FAULT");
    Fault parsed;
    try {
      parsed.rank = std::stoi(parts[0]);
      parsed.step = std::stoll(parts[2]);
    } catch (const std::exception&) {
      CHORUS_THROW(ConfigError, "CHORUS_FAULT: '", fault, "': RANK and STEP must be integers");
    }
    parsed.point = parts[1];
    if (!knownPoint(parsed.point))
      CHORUS_THROW(ConfigError, "CHORUS_FAULT: '", fault, "': the point '", parsed.point,
                   "' is unknown; expected ", pointList());
    parseAction(parts[3], fault, parsed);
    injection.faults_.push_back(parsed);
  }
  return injection;
}

FaultInjection FaultInjection::fromEnvironment() {
  const char* text = std::getenv("CHORUS_FAULT");
  return text == nullptr || *text == '\0' ? FaultInjection{} : parse(text);
}

std::function<void(std::int64_t, const char*)> FaultInjection::hook(int rank) const {
  auto mine = std::make_shared<std::vector<Fault>>();
  for (const Fault& fault : faults_)
    if (fault.rank == rank) mine->push_back(fault);
  if (mine->empty()) return nullptr;
  return [mine](std::int64_t step, const char* point) {
    for (Fault& fault : *mine) {
      if (fault.point != point) continue;
      if (fault.slow_ms > 0 && step >= fault.step)
        std::this_thread::sleep_for(std::chrono::milliseconds(fault.slow_ms));
      if (fault.signal == 0 || fault.step != step) continue;
      const int signal = fault.signal;
      fault.signal = 0;  // once: a stopped worker that is continued goes on
      logWarn("fault injection: signal ", signal, " at ", point, " of step ", step, " (pid ",
              ::getpid(), ")");
      std::raise(signal);
    }
  };
}

}  // namespace chorus::cli
