// Pipeline schedules as data: for every stage, the ordered list of what it does in one step.
//
// A schedule is a program per stage of six kinds of action (receive an activation, forward, send
// the output; receive a gradient, backward, send the input's gradient) on micro-batches
// 0 … M-1. Writing schedules down as lists keeps them testable without running a model: the
// checks below verify ordering, that every send has its receive, that the programs cannot
// deadlock when sends are asynchronous, and how many micro-batches each stage holds at once. The
// engine (pipeline.h) executes these lists verbatim.
//
//   GPipe  every stage runs all M forwards, then all M backwards: each stage holds M micro-batches.
//   1F1B   stage s runs min(p - s - 1, M) warm-up forwards, then alternates one forward and one
//          backward, then drains the remaining backwards (PipeDream-flush, Megatron-LM's default):
//          stage s holds at most p - s micro-batches, and the bubble is the same as GPipe's.
// With equal stage times and free transfers both idle (p - 1) / (M + p - 1) of the step.
#pragma once

#include <string>
#include <vector>

#include "chorus/plan/plan.h"

namespace chorus::parallel {

// The Plan's schedule (plan/plan.h: kGpipe, kOneFOneB; plan::toString, plan::parseSchedule), one
// vocabulary for the planner and the engine.
using plan::Schedule;

enum class ActionKind {
  kRecvActivation,  // from stage s - 1: the input of micro-batch m
  kForward,
  kSendActivation,  // to stage s + 1: the output of micro-batch m
  kRecvGradient,    // from stage s + 1: the gradient of this stage's output of m
  kBackward,
  kSendGradient,  // to stage s - 1: the gradient of this stage's input of m
};

const char* toString(ActionKind kind);

// One action of a stage's program. Value type.
struct PipelineAction {
  ActionKind kind = ActionKind::kForward;
  int micro_batch = 0;

  bool operator==(const PipelineAction& other) const {
    return kind == other.kind && micro_batch == other.micro_batch;
  }
};

// The program of one stage, in execution order.
using StageProgram = std::vector<PipelineAction>;

// The programs of all `stages` stages for `micro_batches` micro-batches. The first stage has no
// receives of activations and sends no gradients; the last stage sends no activations and receives
// no gradients (it computes the loss). REQUIRES: stages >= 1, micro_batches >= 1 (ConfigError).
std::vector<StageProgram> buildSchedule(Schedule schedule, int stages, int micro_batches);

// Everything wrong with `programs` as a schedule of `micro_batches` micro-batches, one line each;
// empty when it is valid. Checked: every stage forwards and backwards each micro-batch exactly
// once, forward before backward; a forward is preceded by its receive (stages > 0) and followed
// by its send (stages < p - 1), a backward likewise; each stage's sends to a neighbour are the
// neighbour's receives in the same order; and the programs run to completion when a send never
// blocks and a receive blocks until its send was issued (no deadlock).
std::vector<std::string> scheduleProblems(const std::vector<StageProgram>& programs,
                                          int micro_batches);

// The most micro-batches `program` holds at once (forwarded, not yet backwarded).
int maxInFlight(const StageProgram& program);

// The theoretical time line of `programs` on stages that take forward_seconds[s] and
// backward_seconds[s] per micro-batch, with free, instant transfers: each action starts as soon
// as the previous action of its stage ended and, for a receive, its send was issued.
struct ScheduleTimeline {
  double makespan = 0;
  // Per stage: the fraction of the makespan the stage spent not computing (its bubble).
  std::vector<double> idle_fraction;
};
// REQUIRES: scheduleProblems(programs, ...) is empty, one time per stage (ConfigError).
ScheduleTimeline simulateSchedule(const std::vector<StageProgram>& programs,
                                  const std::vector<double>& forward_seconds,
                                  const std::vector<double>& backward_seconds);

// The textbook bubble fraction of a pipeline of `stages` equal stages over `micro_batches`
// micro-batches: (p - 1) / (M + p - 1).
double theoreticalBubble(int stages, int micro_batches);

}  // namespace chorus::parallel
