// Pipeline schedules as action lists, checked without running a model.
#include "chorus/parallel/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <sstream>

#include "chorus/core/error.h"

namespace chorus::parallel {
namespace {

using Kind = ActionKind;

std::string joined(const std::vector<std::string>& lines) {
  std::ostringstream text;
  for (const std::string& line : lines) text << line << "\n";
  return text.str();
}

// The compute actions of a program as "F0 B0 ...", for readable expectations.
std::string computeOrder(const StageProgram& program) {
  std::ostringstream text;
  const char* separator = "";
  for (const PipelineAction& action : program) {
    if (action.kind != Kind::kForward && action.kind != Kind::kBackward) continue;
    text << separator << (action.kind == Kind::kForward ? "F" : "B") << action.micro_batch;
    separator = " ";
  }
  return text.str();
}

TEST(PipelineSchedule, EveryShapeIsValidForBothSchedules) {
  for (Schedule schedule : {Schedule::kGpipe, Schedule::kOneFOneB})
    for (int stages = 1; stages <= 6; ++stages)
      for (int micro = 1; micro <= 9; ++micro) {
        const auto programs = buildSchedule(schedule, stages, micro);
        ASSERT_EQ(programs.size(), static_cast<size_t>(stages));
        EXPECT_EQ(joined(scheduleProblems(programs, micro)), "")
            << toString(schedule) << " p=" << stages << " m=" << micro;
      }
}

TEST(PipelineSchedule, OneFOneBHoldsAtMostStagesMinusIndex) {
  for (int stages = 1; stages <= 6; ++stages)
    for (int micro = 1; micro <= 9; ++micro) {
      const auto programs = buildSchedule(Schedule::kOneFOneB, stages, micro);
      for (int s = 0; s < stages; ++s)
        EXPECT_EQ(maxInFlight(programs[s]), std::min(stages - s, micro))
            << "p=" << stages << " m=" << micro << " s=" << s;
    }
}

TEST(PipelineSchedule, GPipeHoldsEveryMicroBatch) {
  const auto programs = buildSchedule(Schedule::kGpipe, 3, 5);
  for (const StageProgram& program : programs) EXPECT_EQ(maxInFlight(program), 5);
  EXPECT_EQ(computeOrder(programs[1]), "F0 F1 F2 F3 F4 B0 B1 B2 B3 B4");
}

TEST(PipelineSchedule, OneFOneBWarmUpSteadyCoolDown) {
  const auto programs = buildSchedule(Schedule::kOneFOneB, 3, 5);
  EXPECT_EQ(computeOrder(programs[0]), "F0 F1 F2 B0 F3 B1 F4 B2 B3 B4");
  EXPECT_EQ(computeOrder(programs[1]), "F0 F1 B0 F2 B1 F3 B2 F4 B3 B4");
  EXPECT_EQ(computeOrder(programs[2]), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4");
}

TEST(PipelineSchedule, TransfersSurroundTheirCompute) {
  const auto programs = buildSchedule(Schedule::kOneFOneB, 2, 1);
  const StageProgram first{{Kind::kForward, 0},
                           {Kind::kSendActivation, 0},
                           {Kind::kRecvGradient, 0},
                           {Kind::kBackward, 0}};
  const StageProgram last{{Kind::kRecvActivation, 0},
                          {Kind::kForward, 0},
                          {Kind::kBackward, 0},
                          {Kind::kSendGradient, 0}};
  EXPECT_EQ(programs[0], first);
  EXPECT_EQ(programs[1], last);
}

TEST(PipelineSchedule, ProblemsAreFound) {
  auto programs = buildSchedule(Schedule::kGpipe, 2, 2);
  // Backward before forward on the last stage.
  auto swapped = programs;
  std::swap(swapped[1][1], swapped[1][4]);
  EXPECT_NE(joined(scheduleProblems(swapped, 2)), "");
  // A receive without its send: the first stage forgets micro-batch 1's send.
  auto missing = programs;
  missing[0].erase(missing[0].begin() + 3);
  EXPECT_NE(joined(scheduleProblems(missing, 2)).find("without its send"), std::string::npos);
  // The last stage receives micro-batch 1 before 0: every stage is fine alone, the pair is not.
  auto reordered = programs;
  for (int i : {0, 1}) reordered[1][i].micro_batch = 1;
  for (int i : {2, 3}) reordered[1][i].micro_batch = 0;
  EXPECT_NE(joined(scheduleProblems(reordered, 2)).find("in order"), std::string::npos);
}

TEST(PipelineSchedule, DeadlockIsFound) {
  // Stage 0 waits for micro-batch 0's gradient before it sends micro-batch 1; stage 1 waits for
  // micro-batch 1 before it back-propagates 0. Every local rule and the transfer order hold; only
  // running the programs shows the cycle.
  const StageProgram first{{Kind::kForward, 0},      {Kind::kSendActivation, 0},
                           {Kind::kRecvGradient, 0}, {Kind::kBackward, 0},
                           {Kind::kForward, 1},      {Kind::kSendActivation, 1},
                           {Kind::kRecvGradient, 1}, {Kind::kBackward, 1}};
  const StageProgram last{{Kind::kRecvActivation, 0}, {Kind::kForward, 0},
                          {Kind::kRecvActivation, 1}, {Kind::kForward, 1},
                          {Kind::kBackward, 0},       {Kind::kSendGradient, 0},
                          {Kind::kBackward, 1},       {Kind::kSendGradient, 1}};
  const std::string problems = joined(scheduleProblems({first, last}, 2));
  EXPECT_NE(problems.find("deadlock"), std::string::npos) << problems;
  EXPECT_EQ(problems.find("stage"), std::string::npos) << problems;
}

TEST(PipelineSchedule, SimulatedBubbleIsTheTextbookFraction) {
  for (Schedule schedule : {Schedule::kGpipe, Schedule::kOneFOneB})
    for (int stages : {2, 3, 4})
      for (int micro : {1, 4, 8}) {
        const auto timeline =
            simulateSchedule(buildSchedule(schedule, stages, micro),
                             std::vector<double>(stages, 1.0), std::vector<double>(stages, 2.0));
        EXPECT_DOUBLE_EQ(timeline.makespan, 3.0 * (micro + stages - 1));
        for (double idle : timeline.idle_fraction)
          EXPECT_NEAR(idle, theoreticalBubble(stages, micro), 1e-12);
      }
}

TEST(PipelineSchedule, ParsesNames) {
  EXPECT_EQ(plan::parseSchedule("gpipe"), Schedule::kGpipe);
  EXPECT_EQ(plan::parseSchedule("1f1b"), Schedule::kOneFOneB);
  EXPECT_THROW(plan::parseSchedule("zb"), ConfigError);
  EXPECT_THROW(buildSchedule(Schedule::kGpipe, 0, 1), ConfigError);
  EXPECT_THROW(buildSchedule(Schedule::kGpipe, 1, 0), ConfigError);
}

}  // namespace
}  // namespace chorus::parallel
