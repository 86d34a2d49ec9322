// SpeedEmulator::ComputeScope::padTo(): a phase whose points are released at the emulated pace, as
// a trainer releases its gradient buckets (noted with computeSoFar() during the compute, released
// after it), reaches each point when the emulated device would have, sleeps what the whole phase
// owes, no more and no less, and keeps waits and its own sleeps out of the compute. On a clock the
// test moves (fake_emulation_clock.h), so every expectation is exact.
#include <gtest/gtest.h>

#include <vector>

#include "chorus/device/speed_emulator.h"
#include "fake_emulation_clock.h"

namespace chorus::device {
namespace {

using testing::FakeEmulationClock;

// Nanosecond rounding of the emulator's counters.
constexpr double kRounding = 1e-8;

TEST(SpeedEmulatorPad, APointIsReleasedWhenTheEmulatedDeviceReachesIt) {
  FakeEmulationClock clock;
  SpeedEmulator emulator(0.5, TimeBasis::kWall, clock);
  const double start = clock.seconds();
  auto phase = emulator.compute();
  clock.compute(0.020);
  const double point = phase.computeSoFar();
  clock.compute(0.030);
  // 50 ms computed; the point at 20 ms of compute is 40 ms into the phase at half speed, past.
  EXPECT_EQ(phase.padTo(point), 0.0);
  const double rest = phase.end();

  const EmulationTotals totals = emulator.totals();
  EXPECT_EQ(totals.phases, 1);
  EXPECT_EQ(totals.pad_points, 1);
  EXPECT_NEAR(point, 0.020, kRounding);
  // The phase as a whole owes (1/speed - 1) x compute, all of it at the end here.
  EXPECT_NEAR(rest, 0.050, kRounding);
  EXPECT_NEAR(totals.padded_seconds, rest, kRounding);
  // What the balancer sees is the whole phase on the emulated device.
  EXPECT_NEAR(phase.deviceSeconds(), 0.100, kRounding);
  EXPECT_NEAR(clock.seconds() - start, 0.100, kRounding);
}

TEST(SpeedEmulatorPad, PointsAreReleasedAtTheirEmulatedMoments) {
  // A backward with four buckets, computed in one block and released after it, as a trainer does
  // at a quarter of the speed: bucket k at 4 x its compute into the phase.
  FakeEmulationClock clock;
  SpeedEmulator emulator(0.25, TimeBasis::kWall, clock);
  const double start = clock.seconds();
  auto phase = emulator.compute();
  std::vector<double> points;
  for (int part = 0; part < 4; ++part) {
    clock.compute(0.005);
    points.push_back(phase.computeSoFar());
  }
  clock.compute(0.005);
  std::vector<double> released;
  for (double point : points) {
    phase.padTo(point);
    released.push_back(clock.seconds() - start);
  }
  phase.end();
  const EmulationTotals totals = emulator.totals();
  EXPECT_EQ(totals.pad_points, 4);
  // The first point, 20 ms in, is reached by the real compute itself (25 ms); the later ones by
  // the padding, exactly at 40, 60 and 80 ms.
  EXPECT_NEAR(released[0], 0.025, kRounding);
  for (size_t k = 1; k < points.size(); ++k) EXPECT_NEAR(released[k], 4 * points[k], kRounding);
  EXPECT_NEAR(totals.padded_seconds, 3 * 0.025, kRounding);
  EXPECT_NEAR(phase.deviceSeconds(), 0.100, kRounding);
  EXPECT_NEAR(clock.seconds() - start, 0.100, kRounding);
}

TEST(SpeedEmulatorPad, ManyPointsKeepTheRatioThoughEverySleepWakesLate) {
  // Millisecond points, each sleep 50 us late, the carried overshoot keeping the sum right.
  FakeEmulationClock clock(50000);
  SpeedEmulator emulator(0.25, TimeBasis::kWall, clock);
  auto phase = emulator.compute();
  std::vector<double> points;
  for (int part = 0; part < 20; ++part) {
    clock.compute(0.001);
    points.push_back(phase.computeSoFar());
  }
  clock.compute(0.001);
  for (double point : points) phase.padTo(point);
  phase.end();
  const EmulationTotals totals = emulator.totals();
  EXPECT_EQ(totals.pad_points, 20);
  EXPECT_GE(totals.padded_seconds, 3 * 0.021 - kRounding);
  EXPECT_LE(totals.padded_seconds, 3 * 0.021 + 50e-6 + kRounding);
  EXPECT_NEAR(phase.deviceSeconds(), 4 * 0.021, kRounding);
}

TEST(SpeedEmulatorPad, AWaitBetweenPointsIsNotPadded) {
  FakeEmulationClock clock;
  SpeedEmulator emulator(0.5, TimeBasis::kWall, clock);
  const double start = clock.seconds();
  auto phase = emulator.compute();
  clock.compute(0.020);
  EXPECT_NEAR(phase.padTo(phase.computeSoFar()), 0.020, kRounding);
  phase.pauseForWait();
  EXPECT_EQ(phase.padTo(phase.computeSoFar()), 0.0);  // nothing is padded during a wait
  clock.block(0.040);
  phase.resume();
  clock.compute(0.010);
  phase.end();
  const EmulationTotals totals = emulator.totals();
  EXPECT_EQ(totals.pad_points, 1);
  EXPECT_NEAR(totals.compute_seconds, 0.030, kRounding);
  EXPECT_NEAR(totals.padded_seconds, 0.030, kRounding);
  // 30 ms of compute at half speed, plus the 40 ms wait once.
  EXPECT_NEAR(clock.seconds() - start, 0.100, kRounding);
}

TEST(SpeedEmulatorPad, NothingIsPaddedAtFullSpeedOrAfterTheEnd) {
  FakeEmulationClock clock;
  SpeedEmulator full(1.0, TimeBasis::kWall, clock);
  auto unpadded = full.compute();
  clock.compute(0.005);
  EXPECT_EQ(unpadded.padTo(unpadded.computeSoFar()), 0.0);
  unpadded.end();
  EXPECT_EQ(full.totals().pad_points, 0);
  EXPECT_EQ(full.totals().padded_seconds, 0.0);

  SpeedEmulator half(0.5, TimeBasis::kWall, clock);
  auto ended = half.compute();
  clock.compute(0.005);
  ended.end();
  const double padded = half.totals().padded_seconds;
  EXPECT_EQ(ended.padTo(0.005), 0.0);
  EXPECT_EQ(half.totals().padded_seconds, padded);
}

// In the CPU basis a part that lost its core longer than its own padding is made up from the
// later parts' padding: the phase as a whole lasts compute / speed, as an unsplit phase does.
TEST(SpeedEmulatorPad, TheCpuBasisPadsThePhaseAsAWhole) {
  FakeEmulationClock clock;
  SpeedEmulator emulator(0.5, TimeBasis::kThreadCpu, clock);
  const double start = clock.seconds();
  auto phase = emulator.compute();
  clock.compute(0.010);
  clock.waitForCore(0.030);  // off the core: 40 ms of wall time, 20 ms owed so far
  EXPECT_EQ(phase.padTo(phase.computeSoFar()), 0.0);
  clock.compute(0.040);
  // 50 ms of CPU owe 100 ms in all; 80 ms of wall time have passed already.
  EXPECT_NEAR(phase.end(), 0.020, kRounding);
  EXPECT_NEAR(phase.deviceSeconds(), 0.100, kRounding);
  EXPECT_NEAR(clock.seconds() - start, 0.100, kRounding);
}

}  // namespace
}  // namespace chorus::device
