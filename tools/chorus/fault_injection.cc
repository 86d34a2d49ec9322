#include "fault_injection.h"

#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <memory>
#include <sstream>

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

int signalOf(const std::string& name, const std::string& fault) {
  if (name == "KILL") return SIGKILL;
  if (name == "STOP") return SIGSTOP;
  CHORUS_THROW(ConfigError, "CHORUS_FAULT: '", fault, "': the signal '", name,
               "' is unknown; expected KILL or STOP");
}

}  // namespace

FaultInjection FaultInjection::parse(const std::string& text) {
  FaultInjection injection;
  for (const std::string& fault : split(text, ',')) {
    const std::vector<std::string> parts = split(fault, ':');
    if (parts.size() != 4)
      CHORUS_THROW(ConfigError, "CHORUS_FAULT: '", fault, "': expected RANK:POINT:STEP:SIGNAL");
    Fault parsed;
    try {
      parsed.rank = std::stoi(parts[0]);
      parsed.step = std::stoll(parts[2]);
    } catch (const std::exception&) {
      CHORUS_THROW(ConfigError, "CHORUS_FAULT: '", fault, "': RANK and STEP must be integers");
    }
    parsed.point = parts[1];
    if (parsed.point != "forward" && parsed.point != "reduce" && parsed.point != "optimizer" &&
        parsed.point != "recovery")
      CHORUS_THROW(ConfigError, "CHORUS_FAULT: '", fault, "': the point '", parsed.point,
                   "' is unknown; expected forward, reduce, optimizer or recovery");
    parsed.signal = signalOf(parts[3], fault);
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
      if (fault.signal == 0 || fault.step != step || fault.point != point) continue;
      const int signal = fault.signal;
      fault.signal = 0;  // once: a stopped worker that is continued goes on
      logWarn("fault injection: signal ", signal, " at ", point, " of step ", step, " (pid ",
              ::getpid(), ")");
      std::raise(signal);
    }
  };
}

}  // namespace chorus::cli
