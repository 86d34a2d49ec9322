// Fault injection for tests of elastic recovery, with real processes: the environment variable
// CHORUS_FAULT (read once at a worker's start-up) names a worker, a point of a step and a signal,
// and that worker sends the signal to itself there, once:
//
//   CHORUS_FAULT="RANK:POINT:STEP:SIGNAL[,RANK:POINT:STEP:SIGNAL...]"
//
// RANK is the launch rank, POINT one of TrainerHooks::at_point's points ("forward", "reduce",
// "optimizer", "recovery"), STEP the 0-based step, SIGNAL "KILL" (a crash) or "STOP" (a hung
// worker; a test sends SIGCONT later). The training code is not changed for it: the CLI connects it
// to the trainer's test hook. Value type.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace chorus::cli {

class FaultInjection {
 public:
  struct Fault {
    int rank = -1;
    std::string point;
    std::int64_t step = -1;
    int signal = 0;
  };

  // Parses `text` (CHORUS_FAULT's syntax). Throws ConfigError naming the bad part.
  static FaultInjection parse(const std::string& text);
  // From the process environment; none when CHORUS_FAULT is unset or empty.
  static FaultInjection fromEnvironment();

  // The at_point hook of launch rank `rank`, or none when no fault names it.
  std::function<void(std::int64_t, const char*)> hook(int rank) const;

 private:
  std::vector<Fault> faults_;
};

}  // namespace chorus::cli
