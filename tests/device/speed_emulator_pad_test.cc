// SpeedEmulator::ComputeScope::padTo(): a phase whose points are released at the emulated pace, as
// a trainer releases its gradient buckets (noted with computeSoFar() during the compute, released
// after it), reaches each point when the emulated device would have, sleeps what the whole phase
// owes, no more and no less, and keeps waits and its own sleeps out of the compute.
//
// Lower bounds are exact properties (a sleep never wakes early, and each pad sleeps at least what
// its part owes); upper bounds allow a late wake-up on a loaded host, as speed_emulator_test does.
#include <gtest/gtest.h>
#include <time.h>

#include <thread>
#include <vector>

#include "chorus/core/clock.h"
#include "chorus/device/speed_emulator.h"

namespace chorus::device {
namespace {

// Keeps the CPU busy for `seconds` of wall time, as real compute does.
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

// A sleeping thread may wake a scheduler time slice late on a loaded 2-core host.
constexpr double kTolerance = 0.025;
// Nanosecond rounding of the emulator's counters.
constexpr double kRounding = 1e-6;

TEST(SpeedEmulatorPad, APointIsReleasedWhenTheEmulatedDeviceReachesIt) {
  SpeedEmulator emulator(0.5);
  Stopwatch watch;
  auto phase = emulator.compute();
  busyFor(0.020);
  const double point = phase.computeSoFar();
  busyFor(0.030);
  // 50 ms computed; the point at 20 ms of compute is 40 ms into the phase at half speed, past.
  EXPECT_EQ(phase.padTo(point), 0.0);
  const double at_point = watch.seconds();
  const double rest = phase.end();

  const EmulationTotals totals = emulator.totals();
  EXPECT_EQ(totals.phases, 1);
  EXPECT_EQ(totals.pad_points, 1);
  EXPECT_GE(point, 0.020);
  EXPECT_LE(point, 0.020 + kTolerance);
  EXPECT_GE(at_point, 0.050);
  EXPECT_GE(totals.compute_seconds, 0.050);
  EXPECT_LE(totals.compute_seconds, 0.050 + kTolerance);
  // The phase as a whole owes (1/speed - 1) x compute, all of it at the end here.
  EXPECT_GE(rest, totals.compute_seconds - kRounding);
  EXPECT_LE(rest, totals.compute_seconds + kTolerance);
  EXPECT_NEAR(totals.padded_seconds, rest, kRounding);
  // What the balancer sees is the whole phase on the emulated device.
  EXPECT_NEAR(phase.deviceSeconds(), 2 * totals.compute_seconds, kRounding);
  EXPECT_GE(watch.seconds(), 2 * totals.compute_seconds - kRounding);
  EXPECT_LE(watch.seconds(), 2 * totals.compute_seconds + kTolerance);
}

TEST(SpeedEmulatorPad, PointsAreReleasedAtTheirEmulatedMoments) {
  // A backward with four buckets, computed in one block and released after it, as a trainer does
  // at a quarter of the speed: bucket k at 4 x its compute into the phase.
  SpeedEmulator emulator(0.25);
  Stopwatch watch;
  auto phase = emulator.compute();
  std::vector<double> points;
  for (int part = 0; part < 4; ++part) {
    busyFor(0.005);
    points.push_back(phase.computeSoFar());
  }
  busyFor(0.005);
  std::vector<double> released;
  for (double point : points) {
    phase.padTo(point);
    released.push_back(watch.seconds());
  }
  phase.end();
  const double total = watch.seconds();
  const EmulationTotals totals = emulator.totals();
  EXPECT_EQ(totals.pad_points, 4);
  for (size_t k = 0; k < points.size(); ++k) {
    // A sleep never wakes early; the first point, 20 ms in, is reached by the real compute itself
    // (25 ms), the later ones by the padding.
    EXPECT_GE(released[k], 4 * points[k] - kRounding) << k;
    if (k > 0) {
      EXPECT_LE(released[k], 4 * points[k] + kTolerance) << k;
    }
  }
  EXPECT_GE(totals.padded_seconds, 3 * totals.compute_seconds - kRounding);
  EXPECT_LE(totals.padded_seconds, 3 * totals.compute_seconds + kTolerance);
  EXPECT_NEAR(phase.deviceSeconds(), 4 * totals.compute_seconds, kRounding);
  EXPECT_GE(total, 4 * totals.compute_seconds - kRounding);
}

TEST(SpeedEmulatorPad, ManyPointsKeepTheRatio) {
  // Millisecond points, each sleep waking late, the carried overshoot keeping the sum right.
  SpeedEmulator emulator(0.25);
  auto phase = emulator.compute();
  std::vector<double> points;
  for (int part = 0; part < 20; ++part) {
    busyFor(0.001);
    points.push_back(phase.computeSoFar());
  }
  busyFor(0.001);
  for (double point : points) phase.padTo(point);
  phase.end();
  const EmulationTotals totals = emulator.totals();
  EXPECT_EQ(totals.pad_points, 20);
  EXPECT_GE(totals.padded_seconds, 3 * totals.compute_seconds - kRounding);
  EXPECT_LE(totals.padded_seconds, 3 * totals.compute_seconds + kTolerance);
  EXPECT_NEAR(phase.deviceSeconds(), 4 * totals.compute_seconds, kRounding);
}

TEST(SpeedEmulatorPad, AWaitBetweenPointsIsNotPadded) {
  SpeedEmulator emulator(0.5);
  auto phase = emulator.compute();
  busyFor(0.020);
  phase.padTo(phase.computeSoFar());
  phase.pauseForWait();
  EXPECT_EQ(phase.padTo(phase.computeSoFar()), 0.0);  // nothing is padded during a wait
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  phase.resume();
  busyFor(0.010);
  phase.end();
  const EmulationTotals totals = emulator.totals();
  EXPECT_EQ(totals.pad_points, 1);
  EXPECT_GE(totals.compute_seconds, 0.030);
  EXPECT_LE(totals.compute_seconds, 0.030 + kTolerance);
  EXPECT_GE(totals.padded_seconds, totals.compute_seconds - kRounding);
  EXPECT_LE(totals.padded_seconds, totals.compute_seconds + kTolerance);
}

TEST(SpeedEmulatorPad, NothingIsPaddedAtFullSpeedOrAfterTheEnd) {
  SpeedEmulator full(1.0);
  auto unpadded = full.compute();
  busyFor(0.005);
  EXPECT_EQ(unpadded.padTo(unpadded.computeSoFar()), 0.0);
  unpadded.end();
  EXPECT_EQ(full.totals().pad_points, 0);
  EXPECT_EQ(full.totals().padded_seconds, 0.0);

  SpeedEmulator half(0.5);
  auto ended = half.compute();
  busyFor(0.005);
  ended.end();
  const double padded = half.totals().padded_seconds;
  EXPECT_EQ(ended.padTo(0.005), 0.0);
  EXPECT_EQ(half.totals().padded_seconds, padded);
}

// In the CPU basis a part that lost its core longer than its own padding is made up from the
// later parts' padding: the phase as a whole lasts compute / speed, as an unsplit phase does.
TEST(SpeedEmulatorPad, TheCpuBasisPadsThePhaseAsAWhole) {
  SpeedEmulator emulator(0.5, TimeBasis::kThreadCpu);
  auto phase = emulator.compute();
  busyForCpu(0.010);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // off the core: 40 ms > 20 owed
  EXPECT_EQ(phase.padTo(phase.computeSoFar()), 0.0);
  busyForCpu(0.040);
  const double rest = phase.end();
  const EmulationTotals totals = emulator.totals();
  // 50 ms of CPU owe 100 ms in all; at least 80 ms of wall time have passed already.
  EXPECT_LE(rest, 0.020 + kTolerance);
  EXPECT_GE(phase.deviceSeconds(), 2 * totals.compute_seconds - kRounding);
  EXPECT_GE(totals.compute_seconds, 0.050);
}

}  // namespace
}  // namespace chorus::device
