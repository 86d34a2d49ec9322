// SpeedEmulator on a clock the test moves (fake_emulation_clock.h): what a phase pads, what it
// leaves out (waits, time off the core), where a step's turn falls, and what a wait for a core
// gives back, each exact. Two tests on the host's clocks check that real sleeps pad real compute
// (lower bounds only: a loaded host wakes late, never early).
#include "chorus/device/speed_emulator.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <stdexcept>
#include <thread>

#include "chorus/core/clock.h"
#include "chorus/core/error.h"
#include "fake_emulation_clock.h"

namespace chorus::device {
namespace {

using testing::FakeEmulationClock;

// Nanosecond rounding of the emulator's counters.
constexpr double kRounding = 1e-8;

TEST(SpeedEmulatorTest, HalfSpeedDoublesComputePhase) {
  FakeEmulationClock clock;
  SpeedEmulator emulator(0.5, TimeBasis::kWall, clock);
  const double start = clock.seconds();
  {
    auto scope = emulator.compute();
    clock.compute(0.050);
  }
  EXPECT_NEAR(clock.seconds() - start, 0.100, kRounding);
  const EmulationTotals totals = emulator.totals();
  EXPECT_EQ(totals.phases, 1);
  EXPECT_NEAR(totals.compute_seconds, 0.050, kRounding);
  EXPECT_NEAR(totals.padded_seconds, 0.050, kRounding);
}

TEST(SpeedEmulatorTest, PauseForWaitIsNotPadded) {
  FakeEmulationClock clock;
  SpeedEmulator emulator(0.5, TimeBasis::kWall, clock);
  const double start = clock.seconds();
  auto scope = emulator.compute();
  clock.compute(0.030);
  scope.pauseForWait();
  clock.block(0.060);  // waiting for a peer
  scope.resume();
  clock.compute(0.020);
  scope.end();
  // 50 ms of compute padded to 100 ms, plus the 60 ms wait once: 160 ms, not 220 ms.
  EXPECT_NEAR(emulator.totals().compute_seconds, 0.050, kRounding);
  EXPECT_NEAR(clock.seconds() - start, 0.160, kRounding);
  EXPECT_NEAR(scope.deviceSeconds(), 0.100, kRounding);
}

TEST(SpeedEmulatorTest, ExcludedWaitIsNotPadded) {
  FakeEmulationClock clock;
  SpeedEmulator emulator(0.5, TimeBasis::kWall, clock);
  auto scope = emulator.compute();
  clock.compute(0.040);
  clock.block(0.040);
  scope.excludeWait(0.040);
  EXPECT_NEAR(scope.end(), 0.040, kRounding);
  EXPECT_EQ(scope.end(), 0.0);  // already ended
  EXPECT_EQ(emulator.totals().phases, 1);
}

TEST(SpeedEmulatorTest, ExcludingMoreThanElapsedPadsNothing) {
  FakeEmulationClock clock;
  SpeedEmulator emulator(0.25, TimeBasis::kWall, clock);
  auto scope = emulator.compute();
  clock.compute(0.005);
  scope.excludeWait(10.0);
  EXPECT_EQ(scope.end(), 0.0);
  EXPECT_EQ(emulator.totals().compute_seconds, 0.0);
}

TEST(SpeedEmulatorTest, FullSpeedAddsNothing) {
  FakeEmulationClock clock;
  SpeedEmulator emulator(1.0, TimeBasis::kWall, clock);
  EXPECT_FALSE(emulator.emulated());
  {
    auto scope = emulator.compute();
    clock.compute(0.030);
  }
  EXPECT_EQ(clock.sleeps(), 0);
  EXPECT_EQ(emulator.totals().padded_seconds, 0.0);
  EXPECT_NEAR(emulator.totals().compute_seconds, 0.030, kRounding);
}

TEST(SpeedEmulatorTest, ManyShortPhasesKeepTheRatioThoughEverySleepWakesLate) {
  // 1 ms phases, every sleep 80 us late: the overshoot carried into the next phase keeps the sum
  // right, so the whole run is off by at most one sleep's lateness, not 200 of them.
  FakeEmulationClock clock(80000);
  SpeedEmulator emulator(0.5, TimeBasis::kWall, clock);
  const double start = clock.seconds();
  for (int i = 0; i < 200; ++i) {
    auto scope = emulator.compute();
    clock.compute(0.001);
  }
  const EmulationTotals totals = emulator.totals();
  EXPECT_NEAR(totals.compute_seconds, 0.200, kRounding);
  EXPECT_GE(totals.padded_seconds, 0.200 - kRounding);
  EXPECT_LE(totals.padded_seconds, 0.200 + 80e-6 + kRounding);
  EXPECT_LE(clock.seconds() - start, 0.400 + 80e-6 + kRounding);
}

TEST(SpeedEmulatorTest, PhaseEndedByExceptionIsNotPadded) {
  FakeEmulationClock clock;
  SpeedEmulator emulator(0.1, TimeBasis::kWall, clock);
  try {
    auto scope = emulator.compute();
    clock.compute(0.020);
    throw std::runtime_error("worker failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(clock.sleeps(), 0);  // not the 180 ms a 0.1 speed would add
  EXPECT_EQ(emulator.totals().phases, 1);
  EXPECT_EQ(emulator.totals().padded_seconds, 0.0);
}

// In the CPU basis a worker off its core uses no CPU time: the padding of a slow device absorbs
// such a loss, but what the phase held the step up for is its wall time when that is longer, and
// that is what a balancer must see.
TEST(SpeedEmulatorTest, DeviceSecondsIncludeTimeOffTheCoreThePaddingCannotAbsorb) {
  FakeEmulationClock clock;
  SpeedEmulator full(1.0, TimeBasis::kThreadCpu, clock);
  auto lost = full.compute();
  clock.compute(0.010);
  clock.waitForCore(0.040);
  lost.end();
  EXPECT_NEAR(lost.deviceSeconds(), 0.050, kRounding);

  SpeedEmulator quarter(0.25, TimeBasis::kThreadCpu, clock);
  const double start = clock.seconds();
  auto absorbed = quarter.compute();
  clock.compute(0.020);
  clock.waitForCore(0.020);
  // 20 ms of CPU at a quarter speed is 80 ms; the 20 ms off the core came out of the padding.
  EXPECT_NEAR(absorbed.end(), 0.040, kRounding);
  EXPECT_NEAR(absorbed.deviceSeconds(), 0.080, kRounding);
  EXPECT_NEAR(clock.seconds() - start, 0.080, kRounding);
}

TEST(SpeedEmulatorTest, PaddingForIsOneOverSpeedMinusOne) {
  EXPECT_DOUBLE_EQ(SpeedEmulator(0.5).paddingFor(2.0), 2.0);
  EXPECT_DOUBLE_EQ(SpeedEmulator(0.25).paddingFor(1.0), 3.0);
  EXPECT_DOUBLE_EQ(SpeedEmulator(1.0).paddingFor(1.0), 0.0);
}

TEST(SpeedEmulatorTest, AStepOffsetMovesTheComputeLaterButNotTheStepsEnd) {
  // Quarter speed, offset 0.5: the first step computes first (nothing to predict from); the
  // second sleeps half of the first's 200 ms window first, computes 50 ms, and pads only what is
  // left, so it still takes 200 ms and its compute starts 100 ms in.
  FakeEmulationClock clock;
  SpeedEmulator emulator(0.25, TimeBasis::kThreadCpu, clock);
  emulator.setStepOffset(0.5);
  for (int step = 0; step < 3; ++step) {
    const double start = clock.seconds();
    emulator.beginStep();
    const double compute_starts = clock.seconds() - start;
    auto phase = emulator.compute();
    clock.compute(0.050);
    phase.end();
    EXPECT_NEAR(clock.seconds() - start, 0.200, kRounding) << "step " << step;
    EXPECT_NEAR(phase.deviceSeconds(), 0.200, kRounding) << "step " << step;
    EXPECT_NEAR(compute_starts, step == 0 ? 0.0 : 0.100, kRounding) << "step " << step;
  }
}

TEST(SpeedEmulatorTest, APauseBetweenStepsIsNotSleptAgain) {
  // A 20 ms compute at quarter speed is an 80 ms step; after a 400 ms pause (an evaluation) the
  // head start is half of at most twice that, 80 ms, not half of the 480 ms since the last step.
  FakeEmulationClock clock;
  SpeedEmulator emulator(0.25, TimeBasis::kThreadCpu, clock);
  emulator.setStepOffset(0.5);
  emulator.beginStep();
  {
    auto phase = emulator.compute();
    clock.compute(0.020);
  }
  clock.block(0.400);
  const double start = clock.seconds();
  emulator.beginStep();
  EXPECT_NEAR(clock.seconds() - start, 0.080, kRounding);
}

TEST(SpeedEmulatorTest, StepsShorterThanTimeSlicesAreNotStaggered) {
  FakeEmulationClock clock;
  SpeedEmulator emulator(0.25, TimeBasis::kThreadCpu, clock);
  emulator.setStepOffset(0.5);
  for (int step = 0; step < 3; ++step) {
    emulator.beginStep();
    auto phase = emulator.compute();
    clock.compute(0.002);  // an 8 ms step on the device
  }
  const double start = clock.seconds();
  emulator.beginStep();
  EXPECT_EQ(clock.seconds(), start);
}

TEST(SpeedEmulatorTest, AStepOffsetMustLeaveRoomForTheCompute) {
  SpeedEmulator emulator(0.25);
  EXPECT_THROW(emulator.setStepOffset(0.8), ConfigError);
  EXPECT_THROW(emulator.setStepOffset(-0.1), ConfigError);
  emulator.setStepOffset(0.75);
  EXPECT_DOUBLE_EQ(emulator.stepOffset(), 0.75);
  SpeedEmulator full(1.0);
  EXPECT_THROW(full.setStepOffset(0.1), ConfigError);
}

TEST(SpeedEmulatorTest, TimeWaitingForACoreBetweenStepsComesOutOfThePadding) {
  // Three workers, each a thread with its own clocks.
  FakeEmulationClock quarter_clock, full_clock, gpu_clock;
  SpeedEmulator quarter(0.25, TimeBasis::kThreadCpu, quarter_clock);
  SpeedEmulator full(1.0, TimeBasis::kThreadCpu, full_clock);
  SpeedEmulator gpu(0.25, TimeBasis::kWall, gpu_clock);
  const auto step = [](SpeedEmulator& emulator, FakeEmulationClock& clock) {
    emulator.beginStep();
    auto phase = emulator.compute();
    clock.compute(0.025);  // a 100 ms step at a quarter speed
  };
  step(quarter, quarter_clock);
  step(full, full_clock);
  step(gpu, gpu_clock);
  for (FakeEmulationClock* clock : {&quarter_clock, &full_clock, &gpu_clock})
    clock->waitForCore(0.020);
  quarter.beginStep();
  full.beginStep();
  gpu.beginStep();
  // Only a padded CPU worker has slack to give the wait back from.
  EXPECT_EQ(full.totals().host_delay_seconds, 0.0);
  EXPECT_EQ(gpu.totals().host_delay_seconds, 0.0);
  EXPECT_NEAR(quarter.totals().host_delay_seconds, 0.020, kRounding);
  // 20 ms of CPU at a quarter speed is 80 ms on the device, counted from when it could have
  // started: the phase lasts 80 ms less the wait, and the balancer still sees 80 ms.
  const double start = quarter_clock.seconds();
  auto phase = quarter.compute();
  quarter_clock.compute(0.020);
  phase.end();
  EXPECT_NEAR(quarter_clock.seconds() - start, 0.060, kRounding);
  EXPECT_NEAR(phase.deviceSeconds(), 0.080, kRounding);

  // A wait during a pause between steps (an evaluation) is not given back.
  quarter_clock.block(0.400);
  quarter_clock.waitForCore(0.020);
  quarter.beginStep();
  EXPECT_NEAR(quarter.totals().host_delay_seconds, 0.020, kRounding);
}

TEST(SpeedEmulatorTest, RejectsSpeedOutsideZeroOne) {
  EXPECT_THROW(SpeedEmulator(0.0), ConfigError);
  EXPECT_THROW(SpeedEmulator(1.5), ConfigError);
  EXPECT_THROW(SpeedEmulator(-0.5), ConfigError);
}

// ---- the host's clocks: a real sleep pads real compute (lower bounds; a host wakes late) ----

void busyForCpu(double seconds) {
  Stopwatch watch;
  volatile double sink = 0;
  while (watch.seconds() < seconds) sink = sink + 1.0;
}

TEST(SpeedEmulatorHostClock, RealSleepPadsRealCompute) {
  SpeedEmulator emulator(0.5);
  Stopwatch watch;
  {
    auto scope = emulator.compute();
    busyForCpu(0.020);
  }
  const EmulationTotals totals = emulator.totals();
  EXPECT_GE(totals.compute_seconds, 0.020);
  EXPECT_GE(totals.padded_seconds, totals.compute_seconds - 1e-6);
  EXPECT_GE(watch.seconds(), 2 * totals.compute_seconds - 1e-6);
}

TEST(SpeedEmulatorHostClock, TheCpuBasisCountsOnlyTheThreadsCpuTime) {
  SpeedEmulator emulator(1.0, TimeBasis::kThreadCpu);
  auto scope = emulator.compute();
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // off the core: no CPU time
  scope.end();
  EXPECT_LT(emulator.totals().compute_seconds, 0.015);
  EXPECT_GE(scope.deviceSeconds(), 0.030);  // but the step was held up that long
}

// The priority is the calling thread's, and threads it starts inherit it; a thread of its own
// keeps the test's main thread as it was.
TEST(SpeedEmulatorHostClock, YieldLowersTheCallingThreadsPriorityOnlyInTheCpuBasis) {
  const int main_nice = ::getpriority(PRIO_PROCESS, 0);
  int asked = -1, seen = -1, inherited = -1, wall_asked = -1, wall_seen = -1;
  std::thread([&] {
    wall_asked = SpeedEmulator(0.25, TimeBasis::kWall).yieldCoreToFasterDevices();
    wall_seen = ::getpriority(PRIO_PROCESS, 0);
    asked = SpeedEmulator(0.25, TimeBasis::kThreadCpu).yieldCoreToFasterDevices();
    seen = ::getpriority(PRIO_PROCESS, 0);
    std::thread([&] { inherited = ::getpriority(PRIO_PROCESS, 0); }).join();
  }).join();
  EXPECT_EQ(wall_asked, 0);
  EXPECT_EQ(wall_seen, main_nice);
  EXPECT_EQ(asked, 10);
  // Lowering a priority needs no privilege; raising it (a test run at nice > 10) may be refused.
  if (main_nice <= 10)
    EXPECT_EQ(seen, 10);
  else
    EXPECT_TRUE(seen == 10 || seen == main_nice) << seen;
  EXPECT_EQ(inherited, seen);
  EXPECT_EQ(::getpriority(PRIO_PROCESS, 0), main_nice);
}

}  // namespace
}  // namespace chorus::device
