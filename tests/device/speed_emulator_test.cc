#include "chorus/device/speed_emulator.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/resource.h>

#include <time.h>

#include <atomic>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "chorus/core/clock.h"
#include "chorus/core/error.h"

namespace chorus::device {
namespace {

// Keeps the CPU busy, as real compute does, rather than sleeping: the emulator must pad whatever
// the phase spent, not only idle time.
void busyFor(double seconds) {
  Stopwatch watch;
  volatile double sink = 0;
  while (watch.seconds() < seconds) sink = sink + 1.0;
}

// Burns `seconds` of this thread's CPU time, however long that takes on a loaded host.
void busyForCpu(double seconds) {
  const auto cpuNow = [] {
    timespec now{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
  };
  const double end = cpuNow() + seconds;
  volatile double sink = 0;
  while (cpuNow() < end) sink = sink + 1.0;
}

// Generous on the slow side: on a loaded 2-core machine a sleeping thread may wake one scheduler
// time slice late. Still far below the differences the tests look for (50 ms and more).
constexpr double kTolerance = 0.025;

TEST(SpeedEmulatorTest, HalfSpeedDoublesComputePhase) {
  SpeedEmulator emulator(0.5);
  Stopwatch watch;
  {
    auto scope = emulator.compute();
    busyFor(0.050);
  }
  const double total = watch.seconds();
  EXPECT_GE(total, 0.100 - 0.002);
  EXPECT_LE(total, 0.100 + kTolerance);
  const EmulationTotals totals = emulator.totals();
  EXPECT_EQ(totals.phases, 1);
  EXPECT_GE(totals.compute_seconds, 0.050);
  EXPECT_LE(totals.compute_seconds, 0.050 + kTolerance);
  EXPECT_GE(totals.padded_seconds, totals.compute_seconds - 0.001);
  EXPECT_LE(totals.padded_seconds, totals.compute_seconds + kTolerance);
}

TEST(SpeedEmulatorTest, PauseForWaitIsNotPadded) {
  SpeedEmulator emulator(0.5);
  Stopwatch watch;
  double waited = 0;
  {
    auto scope = emulator.compute();
    busyFor(0.030);
    scope.pauseForWait();
    Stopwatch wait;
    std::this_thread::sleep_for(std::chrono::milliseconds(60));  // waiting for a peer
    waited = wait.seconds();
    scope.resume();
    busyFor(0.020);
  }
  // 50 ms of compute padded to 100 ms, plus the 60 ms wait once: 160 ms, not 220 ms.
  const double compute = emulator.totals().compute_seconds;
  EXPECT_GE(compute, 0.050);
  EXPECT_LE(compute, 0.050 + kTolerance);
  EXPECT_GE(watch.seconds(), 2 * compute + waited - 0.002);
  EXPECT_LE(watch.seconds(), 2 * compute + waited + kTolerance);
}

TEST(SpeedEmulatorTest, ExcludedWaitIsNotPadded) {
  SpeedEmulator emulator(0.5);
  auto scope = emulator.compute();
  busyFor(0.040);
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  scope.excludeWait(0.040);
  const double slept = scope.end();
  EXPECT_NEAR(slept, 0.040, kTolerance);
  EXPECT_EQ(scope.end(), 0.0);  // already ended
  EXPECT_EQ(emulator.totals().phases, 1);
}

TEST(SpeedEmulatorTest, ExcludingMoreThanElapsedPadsNothing) {
  SpeedEmulator emulator(0.25);
  auto scope = emulator.compute();
  busyFor(0.005);
  scope.excludeWait(10.0);
  EXPECT_EQ(scope.end(), 0.0);
  EXPECT_EQ(emulator.totals().compute_seconds, 0.0);
}

TEST(SpeedEmulatorTest, FullSpeedAddsNothing) {
  SpeedEmulator emulator(1.0);
  EXPECT_FALSE(emulator.emulated());
  Stopwatch watch;
  {
    auto scope = emulator.compute();
    busyFor(0.030);
  }
  EXPECT_LE(watch.seconds(), 0.030 + kTolerance);
  EXPECT_EQ(emulator.totals().padded_seconds, 0.0);
  EXPECT_GE(emulator.totals().compute_seconds, 0.030);
  EXPECT_LE(emulator.totals().compute_seconds, 0.030 + kTolerance);
}

TEST(SpeedEmulatorTest, ManyShortPhasesKeepExactRatio) {
  // 1 ms phases: each sleep wakes late, and the carried overshoot must keep the sum right.
  SpeedEmulator emulator(0.5);
  Stopwatch watch;
  for (int i = 0; i < 50; ++i) {
    auto scope = emulator.compute();
    busyFor(0.001);
  }
  const EmulationTotals totals = emulator.totals();
  EXPECT_GE(totals.padded_seconds, totals.compute_seconds - 0.001);
  EXPECT_LE(totals.padded_seconds, totals.compute_seconds + kTolerance);
  EXPECT_NEAR(watch.seconds(), 2 * totals.compute_seconds, kTolerance);
}

TEST(SpeedEmulatorTest, PhaseEndedByExceptionIsNotPadded) {
  SpeedEmulator emulator(0.1);
  Stopwatch watch;
  try {
    auto scope = emulator.compute();
    busyFor(0.020);
    throw std::runtime_error("worker failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_LT(watch.seconds(), 0.020 + kTolerance);  // not the 200 ms a 0.1 speed would take
  EXPECT_EQ(emulator.totals().phases, 1);
  EXPECT_EQ(emulator.totals().padded_seconds, 0.0);
}

// In the CPU basis a worker that is off its core (a sleep here) uses no CPU time: the padding of a
// slow device absorbs such a loss, but what the phase held the step up for is its wall time when
// that is longer, and that is what a balancer must see.
TEST(SpeedEmulatorTest, DeviceSecondsIncludeTimeOffTheCoreThePaddingCannotAbsorb) {
  SpeedEmulator full(1.0, TimeBasis::kThreadCpu);
  auto lost = full.compute();
  busyForCpu(0.010);
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  lost.end();
  EXPECT_GE(lost.deviceSeconds(), 0.050);
  EXPECT_LE(lost.deviceSeconds(), 0.050 + kTolerance);

  SpeedEmulator quarter(0.25, TimeBasis::kThreadCpu);
  Stopwatch watch;
  auto absorbed = quarter.compute();
  busyForCpu(0.020);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const double slept = absorbed.end();
  // 20 ms of CPU at a quarter speed; the 20 ms or more off the core came out of the padding.
  EXPECT_GE(absorbed.deviceSeconds(), 0.080);
  EXPECT_LE(absorbed.deviceSeconds(), 0.080 + 0.002);
  EXPECT_LE(slept, 0.040 + 0.002);
  EXPECT_GE(watch.seconds(), 0.080);
  EXPECT_LE(watch.seconds(), 0.080 + kTolerance);
}

TEST(SpeedEmulatorTest, PaddingForIsOneOverSpeedMinusOne) {
  EXPECT_DOUBLE_EQ(SpeedEmulator(0.5).paddingFor(2.0), 2.0);
  EXPECT_DOUBLE_EQ(SpeedEmulator(0.25).paddingFor(1.0), 3.0);
  EXPECT_DOUBLE_EQ(SpeedEmulator(1.0).paddingFor(1.0), 0.0);
}

TEST(SpeedEmulatorTest, SlowerDevicesAskForLowerPriority) {
  EXPECT_EQ(SpeedEmulator::niceFor(1.0), 0);
  EXPECT_EQ(SpeedEmulator::niceFor(0.5), 5);
  EXPECT_EQ(SpeedEmulator::niceFor(0.25), 10);
  EXPECT_EQ(SpeedEmulator::niceFor(0.125), 15);
  EXPECT_EQ(SpeedEmulator::niceFor(0.01), 19);  // the most nice allows
}

// The priority is the calling thread's, and threads it starts inherit it; a thread of its own
// keeps the test's main thread as it was.
TEST(SpeedEmulatorTest, YieldLowersTheCallingThreadsPriorityOnlyInTheCpuBasis) {
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

TEST(SpeedEmulatorTest, AStepOffsetMovesTheComputeLaterButNotTheStepsEnd) {
  // Quarter speed, offset 0.5: the first step computes first (nothing to predict from); the
  // second sleeps half of the first's 200 ms window first, computes 50 ms, and pads only what is
  // left, so it still takes 200 ms and its compute starts 100 ms in.
  SpeedEmulator emulator(0.25, TimeBasis::kThreadCpu);
  emulator.setStepOffset(0.5);
  for (int step = 0; step < 2; ++step) {
    Stopwatch watch;
    emulator.beginStep();
    const double compute_starts = watch.seconds();
    auto phase = emulator.compute();
    busyForCpu(0.050);
    phase.end();
    const double total = watch.seconds();
    EXPECT_GE(total, 0.200 - 0.002) << "step " << step;
    EXPECT_LE(total, 0.200 + kTolerance) << "step " << step;
    EXPECT_GE(phase.deviceSeconds(), 0.200 - 0.002);
    EXPECT_LE(phase.deviceSeconds(), 0.200 + kTolerance);
    if (step == 0) {
      EXPECT_LT(compute_starts, 0.002);
    } else {
      EXPECT_GE(compute_starts, 0.100 - 0.001);
      EXPECT_LE(compute_starts, 0.100 + kTolerance);
    }
  }
}

TEST(SpeedEmulatorTest, APauseBetweenStepsIsNotSleptAgain) {
  // A 20 ms compute at quarter speed is an 80 ms step; after a 400 ms pause (an evaluation) the
  // head start is half of at most twice that, 80 ms, not half of the 480 ms since the last step.
  SpeedEmulator emulator(0.25, TimeBasis::kThreadCpu);
  emulator.setStepOffset(0.5);
  emulator.beginStep();
  {
    auto phase = emulator.compute();
    busyForCpu(0.020);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  Stopwatch watch;
  emulator.beginStep();
  const double head_start = watch.seconds();
  EXPECT_GE(head_start, 0.080 - 0.001);
  EXPECT_LE(head_start, 0.080 + kTolerance);
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

// Makes the calling thread wait for its CPU: pins it and a competitor at the same priority to one
// CPU and burns `cpu_seconds` of the caller's CPU time while the competitor spins, so that the
// caller is runnable about as long again without running. Restores the caller's affinity.
void waitForACore(double cpu_seconds) {
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(sched_getcpu(), &one);
  std::atomic<bool> spinning{false}, done{false};
  std::thread competitor([&] {
    sched_setaffinity(0, sizeof one, &one);
    spinning = true;
    while (!done) {
    }
  });
  while (!spinning) std::this_thread::yield();
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  busyForCpu(cpu_seconds);
  done = true;
  competitor.join();
  sched_setaffinity(0, sizeof before, &before);
}

bool kernelReportsRunDelay() { return std::ifstream("/proc/thread-self/schedstat").good(); }

TEST(SpeedEmulatorTest, TimeWaitingForACoreBetweenStepsComesOutOfThePadding) {
  if (!kernelReportsRunDelay()) GTEST_SKIP() << "no /proc/thread-self/schedstat";
  SpeedEmulator quarter(0.25, TimeBasis::kThreadCpu);
  SpeedEmulator full(1.0, TimeBasis::kThreadCpu);
  SpeedEmulator gpu(0.25, TimeBasis::kWall);
  for (SpeedEmulator* emulator : {&full, &gpu}) {
    emulator->beginStep();
    auto phase = emulator->compute();
    busyForCpu(0.002);
  }
  // A step of 100 ms on the device: the next one ~40 ms after it ends is no pause (< 200 ms).
  Stopwatch since_step;
  quarter.beginStep();
  {
    auto phase = quarter.compute();
    busyForCpu(0.025);
  }
  waitForACore(0.020);
  for (SpeedEmulator* emulator : {&quarter, &full, &gpu}) emulator->beginStep();
  ASSERT_LT(since_step.seconds(), 0.200) << "the host was too slow to tell a step from a pause";
  // Only a padded CPU worker has slack to give the wait back from.
  EXPECT_EQ(full.totals().host_delay_seconds, 0.0);
  EXPECT_EQ(gpu.totals().host_delay_seconds, 0.0);
  const double waited = quarter.totals().host_delay_seconds;
  EXPECT_GE(waited, 0.005);
  EXPECT_LE(waited, 0.060);
  // 20 ms of CPU at a quarter speed is 80 ms on the device, counted from when it could have
  // started: the phase lasts 80 ms less the wait.
  Stopwatch watch;
  auto phase = quarter.compute();
  busyForCpu(0.020);
  phase.end();
  EXPECT_GE(watch.seconds(), 0.080 - waited - 0.002);
  EXPECT_LE(watch.seconds(), 0.080 - waited + kTolerance);
  EXPECT_GE(phase.deviceSeconds(), 0.080 - 0.002);  // what the balancer sees does not change

  // A wait during a pause between steps (an evaluation) is not given back.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  waitForACore(0.020);
  quarter.beginStep();
  EXPECT_EQ(quarter.totals().host_delay_seconds, waited);
}

TEST(StaggerOffsets, WorkersTakeTurnsOnACore) {
  // cpu@1 has a core; cpu@0.5 another, and cpu@0.25 computes after it, whatever the order and
  // however many cores are idle (computing at once slows both through the shared caches), the
  // core's spare quarter split between the two turns' ends: [0, 0.5) and [0.625, 0.875).
  EXPECT_EQ(staggerOffsets({1.0, 0.5, 0.25}, 3), (std::vector<double>{0, 0, 0.625}));
  EXPECT_EQ(staggerOffsets({1.0, 0.5, 0.25}, 2), (std::vector<double>{0, 0, 0.625}));
  EXPECT_EQ(staggerOffsets({0.25, 1.0, 0.5}, 2), (std::vector<double>{0.625, 0, 0}));
  // Two devices that need 0.6 of a core together take turns on one: [0, 0.522), [0.7225, 0.799).
  const std::vector<double> pair = staggerOffsets({0.522, 0.077}, 2);
  EXPECT_EQ(pair[0], 0);
  EXPECT_NEAR(pair[1], 0.7225, 1e-12);
  // The fullest core that stays at most 0.8 busy takes the third: 0.6 + (1 - 0.75) / 2; 0.3
  // would have made it 0.9, so it got the other core.
  const std::vector<double> thirds = staggerOffsets({0.6, 0.3, 0.15}, 2);
  EXPECT_EQ(thirds[0], 0);
  EXPECT_EQ(thirds[1], 0);
  EXPECT_NEAR(thirds[2], 0.725, 1e-12);
  // Four half-speed workers on two cores: two turns per core, no room to spare.
  EXPECT_EQ(staggerOffsets({0.5, 0.5, 0.5, 0.5}, 2), (std::vector<double>{0, 0, 0.5, 0.5}));
  // No room anywhere: computes at once, as without staggering.
  EXPECT_EQ(staggerOffsets({1.0, 1.0, 0.5}, 2), (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(staggerOffsets({1.0, 1.0, 0.5}, 1), (std::vector<double>{0, 0, 0}));
  // Every turn ends inside its window.
  const std::vector<double> speeds = {0.35, 0.35, 0.35, 0.2, 0.1};
  const std::vector<double> offsets = staggerOffsets(speeds, 2);
  for (size_t i = 0; i < speeds.size(); ++i) EXPECT_LE(offsets[i] + speeds[i], 1 + 1e-12) << i;
}

TEST(SpeedEmulatorTest, RejectsSpeedOutsideZeroOne) {
  EXPECT_THROW(SpeedEmulator(0.0), ConfigError);
  EXPECT_THROW(SpeedEmulator(1.5), ConfigError);
  EXPECT_THROW(SpeedEmulator(-0.5), ConfigError);
}

}  // namespace
}  // namespace chorus::device
