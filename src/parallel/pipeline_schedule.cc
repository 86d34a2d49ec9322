#include "chorus/parallel/pipeline_schedule.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "chorus/core/error.h"
#include "chorus/core/name_table.h"

namespace chorus::parallel {
namespace {

// Appends the forward of micro-batch m on stage s of p, with its transfers.
void addForward(StageProgram& program, int s, int p, int m) {
  if (s > 0) program.push_back({ActionKind::kRecvActivation, m});
  program.push_back({ActionKind::kForward, m});
  if (s + 1 < p) program.push_back({ActionKind::kSendActivation, m});
}

void addBackward(StageProgram& program, int s, int p, int m) {
  if (s + 1 < p) program.push_back({ActionKind::kRecvGradient, m});
  program.push_back({ActionKind::kBackward, m});
  if (s > 0) program.push_back({ActionKind::kSendGradient, m});
}

StageProgram gpipe(int s, int p, int micro_batches) {
  StageProgram program;
  for (int m = 0; m < micro_batches; ++m) addForward(program, s, p, m);
  for (int m = 0; m < micro_batches; ++m) addBackward(program, s, p, m);
  return program;
}

StageProgram oneFOneB(int s, int p, int micro_batches) {
  StageProgram program;
  const int warmup = std::min(p - s - 1, micro_batches);
  int forwarded = 0, backwarded = 0;
  while (forwarded < warmup) addForward(program, s, p, forwarded++);
  while (forwarded < micro_batches) {
    addForward(program, s, p, forwarded++);
    addBackward(program, s, p, backwarded++);
  }
  while (backwarded < micro_batches) addBackward(program, s, p, backwarded++);
  return program;
}

bool isSend(ActionKind kind) {
  return kind == ActionKind::kSendActivation || kind == ActionKind::kSendGradient;
}
bool isReceive(ActionKind kind) {
  return kind == ActionKind::kRecvActivation || kind == ActionKind::kRecvGradient;
}
bool isCompute(ActionKind kind) {
  return kind == ActionKind::kForward || kind == ActionKind::kBackward;
}

// A message between neighbours: (receiving stage, receive kind, micro-batch).
using Message = std::tuple<int, ActionKind, int>;

// The message a send issues, from stage s.
Message messageOf(int s, const PipelineAction& send) {
  if (send.kind == ActionKind::kSendActivation)
    return {s + 1, ActionKind::kRecvActivation, send.micro_batch};
  return {s - 1, ActionKind::kRecvGradient, send.micro_batch};
}

// Runs the programs with asynchronous sends and blocking receives. `on_action(s, action, start)`
// sees every action with its start time; compute actions last duration(s, kind). Returns the
// number of actions that never ran (non-zero: deadlock) and each stage's end time.
template <typename Duration, typename OnAction>
int run(const std::vector<StageProgram>& programs, const Duration& duration,
        const OnAction& on_action, std::vector<double>* end_times) {
  const int p = static_cast<int>(programs.size());
  std::vector<size_t> next(p, 0);
  std::vector<double> clock(p, 0.0);
  std::map<Message, double> sent;  // message -> when it was issued
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int s = 0; s < p; ++s) {
      while (next[s] < programs[s].size()) {
        const PipelineAction& action = programs[s][next[s]];
        double start = clock[s];
        if (isReceive(action.kind)) {
          const auto found = sent.find(Message{s, action.kind, action.micro_batch});
          if (found == sent.end()) break;
          start = std::max(start, found->second);
          sent.erase(found);
        }
        if (isSend(action.kind)) sent.emplace(messageOf(s, action), start);
        on_action(s, action, start);
        clock[s] = start + (isCompute(action.kind) ? duration(s, action.kind) : 0.0);
        ++next[s];
        progressed = true;
      }
    }
  }
  int stuck = 0;
  for (int s = 0; s < p; ++s) stuck += static_cast<int>(programs[s].size() - next[s]);
  if (end_times != nullptr) *end_times = clock;
  return stuck;
}

// The micro-batches of the actions of `kind` in `program`, in order.
std::vector<int> sequenceOf(const StageProgram& program, ActionKind kind) {
  std::vector<int> sequence;
  for (const PipelineAction& action : program)
    if (action.kind == kind) sequence.push_back(action.micro_batch);
  return sequence;
}

// Checks one stage's own program; appends problems.
void checkStage(const StageProgram& program, int s, int p, int micro_batches,
                std::vector<std::string>& problems) {
  auto report = [&](const std::string& what) {
    problems.push_back("stage " + std::to_string(s) + ": " + what);
  };
  std::vector<int> forwards(micro_batches, 0), backwards(micro_batches, 0);
  for (size_t i = 0; i < program.size(); ++i) {
    const PipelineAction& action = program[i];
    const int m = action.micro_batch;
    if (m < 0 || m >= micro_batches) {
      report("micro-batch " + std::to_string(m) + " out of range");
      continue;
    }
    const bool first = s == 0, last = s + 1 == p;
    auto previous = [&](ActionKind kind) {
      return i > 0 && program[i - 1] == PipelineAction{kind, m};
    };
    auto following = [&](ActionKind kind) {
      return i + 1 < program.size() && program[i + 1] == PipelineAction{kind, m};
    };
    const std::string what = std::string(toString(action.kind)) + " " + std::to_string(m);
    switch (action.kind) {
      case ActionKind::kForward:
        if (++forwards[m] > 1) report(what + " twice");
        if (!first && !previous(ActionKind::kRecvActivation)) report(what + " without its receive");
        if (!last && !following(ActionKind::kSendActivation)) report(what + " without its send");
        break;
      case ActionKind::kBackward:
        if (++backwards[m] > 1) report(what + " twice");
        if (forwards[m] == 0) report(what + " before its forward");
        if (!last && !previous(ActionKind::kRecvGradient)) report(what + " without its receive");
        if (!first && !following(ActionKind::kSendGradient)) report(what + " without its send");
        break;
      case ActionKind::kRecvActivation:
      case ActionKind::kSendGradient:
        if (first) report(what + " on the first stage");
        break;
      case ActionKind::kSendActivation:
      case ActionKind::kRecvGradient:
        if (last) report(what + " on the last stage");
        break;
    }
  }
  for (int m = 0; m < micro_batches; ++m)
    if (forwards[m] == 0 || backwards[m] == 0)
      report("micro-batch " + std::to_string(m) + " is not both forwarded and backwarded");
}

}  // namespace

const char* toString(ActionKind kind) {
  static constexpr NamedValue<ActionKind> kNames[] = {
      {ActionKind::kRecvActivation, "recv-activation"},
      {ActionKind::kForward, "forward"},
      {ActionKind::kSendActivation, "send-activation"},
      {ActionKind::kRecvGradient, "recv-gradient"},
      {ActionKind::kBackward, "backward"},
      {ActionKind::kSendGradient, "send-gradient"}};
  return nameOf(kNames, kind);
}

std::vector<StageProgram> buildSchedule(Schedule schedule, int stages, int micro_batches) {
  CHORUS_CHECK_CONFIG(stages >= 1, "a pipeline needs at least one stage, got ", stages);
  CHORUS_CHECK_CONFIG(micro_batches >= 1, "a pipeline needs at least one micro-batch, got ",
                      micro_batches);
  std::vector<StageProgram> programs;
  for (int s = 0; s < stages; ++s)
    programs.push_back(schedule == Schedule::kGpipe ? gpipe(s, stages, micro_batches)
                                                    : oneFOneB(s, stages, micro_batches));
  return programs;
}

std::vector<std::string> scheduleProblems(const std::vector<StageProgram>& programs,
                                          int micro_batches) {
  std::vector<std::string> problems;
  const int p = static_cast<int>(programs.size());
  for (int s = 0; s < p; ++s) checkStage(programs[s], s, p, micro_batches, problems);
  for (int s = 0; s + 1 < p; ++s) {
    if (sequenceOf(programs[s], ActionKind::kSendActivation) !=
        sequenceOf(programs[s + 1], ActionKind::kRecvActivation))
      problems.push_back("activations stage " + std::to_string(s) + " sends are not the ones " +
                         std::to_string(s + 1) + " receives, in order");
    if (sequenceOf(programs[s + 1], ActionKind::kSendGradient) !=
        sequenceOf(programs[s], ActionKind::kRecvGradient))
      problems.push_back("gradients stage " + std::to_string(s + 1) + " sends are not the ones " +
                         std::to_string(s) + " receives, in order");
  }
  if (!problems.empty()) return problems;
  const auto no_time = [](int, ActionKind) { return 0.0; };
  const int stuck = run(
      programs, no_time, [](int, const PipelineAction&, double) {}, nullptr);
  if (stuck > 0)
    problems.push_back("deadlock: " + std::to_string(stuck) + " actions can never run");
  return problems;
}

int maxInFlight(const StageProgram& program) {
  int held = 0, most = 0;
  for (const PipelineAction& action : program) {
    if (action.kind == ActionKind::kForward) most = std::max(most, ++held);
    if (action.kind == ActionKind::kBackward) --held;
  }
  return most;
}

ScheduleTimeline simulateSchedule(const std::vector<StageProgram>& programs,
                                  const std::vector<double>& forward_seconds,
                                  const std::vector<double>& backward_seconds) {
  const size_t p = programs.size();
  CHORUS_CHECK_CONFIG(forward_seconds.size() == p && backward_seconds.size() == p,
                      "simulateSchedule: need one forward and one backward time per stage");
  std::vector<double> busy(p, 0.0), ends;
  const auto duration = [&](int s, ActionKind kind) {
    return kind == ActionKind::kForward ? forward_seconds[s] : backward_seconds[s];
  };
  const auto count = [&](int s, const PipelineAction& action, double) {
    if (isCompute(action.kind)) busy[s] += duration(s, action.kind);
  };
  CHORUS_CHECK_CONFIG(run(programs, duration, count, &ends) == 0,
                      "simulateSchedule: the schedule deadlocks");
  ScheduleTimeline timeline;
  timeline.makespan = ends.empty() ? 0.0 : *std::max_element(ends.begin(), ends.end());
  for (size_t s = 0; s < p; ++s)
    timeline.idle_fraction.push_back(timeline.makespan > 0 ? 1.0 - busy[s] / timeline.makespan
                                                           : 0.0);
  return timeline;
}

double theoreticalBubble(int stages, int micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

}  // namespace chorus::parallel
