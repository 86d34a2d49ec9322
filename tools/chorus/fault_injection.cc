#include "fault_injection.h"

#include <unistd.h>

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
    if (parsed.point != "forward" && parsed.point != "reduce" && parsed.point != "optimizer" &&
        parsed.point != "recovery" && parsed.point != "regroup" && parsed.point != "rebuild" &&
        parsed.point != "checkpoint" && parsed.point != "join")
      CHORUS_THROW(ConfigError, "CHORUS_FAULT: '", fault, "': the point '", parsed.point,
                   "' is unknown; expected forward, reduce, optimizer, recovery, regroup, "
                   "rebuild, checkpoint or join");
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
