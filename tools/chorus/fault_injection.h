// Fault injection for tests of elastic recovery, with real processes: the environment variable
// CHORUS_FAULT (read once at a worker's start-up) names a worker, a point of a step and a fault,
// and that worker injects the fault there:
//
//   CHORUS_FAULT="RANK:POINT:STEP:FAULT[,RANK:POINT:STEP:FAULT...]"
//
// RANK is the launch rank (a replacement's: its member id), POINT one of TrainerHooks::at_point's
// points ("forward", "reduce", "optimizer", "recovery", "regroup", "rebuild", "checkpoint") or
// "join" (a replacement worker, started and about to ask to join the running job, at step 0),
// STEP the 0-based step, FAULT "KILL" (the worker sends itself SIGKILL there, once: a crash),
// "STOP" (SIGSTOP, once: a hung worker; a test sends SIGCONT later) or "SLOW<ms>" (it sleeps that
// long there in that step and every later one: a straggler, or a job slow enough for a
// replacement worker to join while it runs). The training code is not
// changed for it: the CLI connects it to the trainer's test hook. Value type.
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
    int slow_ms = 0;  // SLOW<ms>: sleeps at every step from `step` on
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
