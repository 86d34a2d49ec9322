#include "chorus/device/speed_emulator.h"

#include <algorithm>
#include <exception>

#include "chorus/core/error.h"
#include "chorus/device/host_sharing.h"

namespace chorus::device {
namespace {

// The shortest step whose turns are staggered (SpeedEmulator::beginStep): 20 ms.
constexpr std::int64_t kMinStaggeredStepNs = 20000000;

std::int64_t toNanos(double seconds) { return static_cast<std::int64_t>(seconds * 1e9); }
double toSeconds(std::int64_t nanos) { return static_cast<double>(nanos) * 1e-9; }

}  // namespace

SpeedEmulator::ComputeScope::ComputeScope(SpeedEmulator* owner)
    : owner_(owner),
      start_ns_(owner->clock_.nowNanos()),
      cpu_start_ns_(owner->basis_ == TimeBasis::kThreadCpu ? owner->clock_.threadCpuNanos() : 0),
      uncaught_at_start_(std::uncaught_exceptions()) {}

SpeedEmulator::ComputeScope::ComputeScope(ComputeScope&& other) noexcept
    : owner_(other.owner_),
      start_ns_(other.start_ns_),
      cpu_start_ns_(other.cpu_start_ns_),
      device_seconds_(other.device_seconds_),
      paused_at_ns_(other.paused_at_ns_),
      excluded_ns_(other.excluded_ns_),
      slept_ns_(other.slept_ns_),
      settled_ns_(other.settled_ns_),
      paused_(other.paused_),
      uncaught_at_start_(other.uncaught_at_start_) {
  other.owner_ = nullptr;
}

SpeedEmulator::ComputeScope::~ComputeScope() {
  if (owner_ == nullptr) return;
  // A new exception in flight means the phase failed: record it, but do not delay the error.
  const bool unwinding = std::uncaught_exceptions() > uncaught_at_start_;
  const double compute = computeSeconds();
  owner_->finishPhase(compute, owedSoFar(compute, wallSeconds()), !unwinding);
  owner_ = nullptr;
}

void SpeedEmulator::ComputeScope::pauseForWait() {
  if (paused_) return;
  paused_ = true;
  paused_at_ns_ = owner_->clock_.nowNanos();
}

void SpeedEmulator::ComputeScope::resume() {
  if (!paused_) return;
  paused_ = false;
  excluded_ns_ += owner_->clock_.nowNanos() - paused_at_ns_;
}

void SpeedEmulator::ComputeScope::excludeWait(double seconds) {
  if (seconds <= 0) return;
  excluded_ns_ += toNanos(seconds);
}

double SpeedEmulator::ComputeScope::computeSeconds() const {
  // A blocked wait uses no CPU, so the CPU clock excludes waits by itself.
  if (owner_->basis_ == TimeBasis::kThreadCpu)
    return toSeconds(owner_->clock_.threadCpuNanos() - cpu_start_ns_);
  return wallSeconds();
}

double SpeedEmulator::ComputeScope::wallSeconds() const {
  // A phase that ends while paused ends its wait at the same moment.
  const std::int64_t now = owner_->clock_.nowNanos();
  std::int64_t excluded = excluded_ns_;
  if (paused_) excluded += now - paused_at_ns_;
  return toSeconds(std::max<std::int64_t>(0, (now - start_ns_) - excluded - slept_ns_));
}

std::int64_t SpeedEmulator::ComputeScope::owedSoFar(double compute_seconds, double wall_seconds) {
  // Padding is owed for the phase as a whole (compute / speed against its wall time), so a part
  // that lost its core longer than its own padding is made up from the parts that did not. What
  // an earlier pad point settled cannot be unslept: the total only grows.
  const std::int64_t total =
      toNanos(std::max(0.0, compute_seconds / owner_->speed_ - wall_seconds));
  if (total <= settled_ns_) return 0;
  const std::int64_t owed = total - settled_ns_;
  settled_ns_ = total;
  return owed;
}

double SpeedEmulator::ComputeScope::computeSoFar() const {
  return owner_ == nullptr ? 0 : computeSeconds();
}

double SpeedEmulator::ComputeScope::padTo(double compute_seconds) {
  if (owner_ == nullptr || paused_ || !owner_->emulated()) return 0;
  owner_->pad_points_.fetch_add(1, std::memory_order_relaxed);
  const std::int64_t owed = owedSoFar(compute_seconds, wallSeconds());
  if (owed <= 0) return 0;
  const std::int64_t start = owner_->clock_.nowNanos();
  const std::int64_t slept = owner_->sleepOwed(owed);
  slept_ns_ += owner_->clock_.nowNanos() - start;
  return toSeconds(slept);
}

double SpeedEmulator::ComputeScope::end() {
  if (owner_ == nullptr) return 0;
  const double compute = computeSeconds();
  const double wall = wallSeconds();
  device_seconds_ = std::max(compute / owner_->speed_, wall);
  const double slept = owner_->finishPhase(compute, owedSoFar(compute, wall), true);
  owner_ = nullptr;
  return slept;
}

SpeedEmulator::SpeedEmulator(double speed, TimeBasis basis, EmulationClock& clock)
    : speed_(speed), basis_(basis), clock_(clock) {
  CHORUS_CHECK_CONFIG(speed > 0 && speed <= 1, "emulated speed must be in (0, 1], got ", speed);
}

double SpeedEmulator::paddingFor(double compute_seconds) const {
  return (1.0 / speed_ - 1.0) * std::max(0.0, compute_seconds);
}

int SpeedEmulator::yieldCoreToFasterDevices() const {
  if (basis_ != TimeBasis::kThreadCpu) return 0;
  return lowerThreadPriority(speed_);
}

void SpeedEmulator::setStepOffset(double fraction) {
  CHORUS_CHECK_CONFIG(fraction >= 0 && fraction <= 1 - speed_ + 1e-9,
                      "emulated step offset must be in [0, 1 - speed] = [0, ", 1 - speed_,
                      "], got ", fraction);
  step_offset_ = std::max(0.0, std::min(fraction, 1 - speed_));
}

void SpeedEmulator::beginStep() {
  const std::int64_t start = clock_.nowNanos();
  const std::int64_t delay = takeHostDelay();
  std::int64_t window = 0;
  bool paused = false;
  if (step_began_) {
    // The turns are fractions of the step, so the previous step's length places this one, not
    // this device's own compute: a device with a small share would otherwise take its turn
    // early, inside the turn before it, be slowed by sharing the core, look slower still to the
    // balancer and lose more of its share. At most twice its own emulated compute, so that a
    // pause between steps (an evaluation, a checkpoint) does not become a sleep.
    const std::int64_t interval = start - last_step_began_ns_;
    const std::int64_t longest = 2 * std::max(step_target_ns_, last_step_target_ns_);
    window = std::min(interval, longest);
    paused = interval > longest;
  }
  if (step_target_ns_ > 0) last_step_target_ns_ = step_target_ns_;
  step_target_ns_ = 0;
  // Nor is a wait for a core during such a pause (an evaluation on every worker at once) owed
  // back: it is not this step's.
  credit_ns_ = paused ? 0 : delay;
  delay_ns_.fetch_add(credit_ns_, std::memory_order_relaxed);
  step_began_ = true;
  last_step_began_ns_ = start;
  // Turns much shorter than the scheduler's time slices (a few milliseconds) cannot be kept apart:
  // the head start only adds a wake-up to each step (a 5 ms MLP step grew 40%).
  if (step_offset_ <= 0 || window < kMinStaggeredStepNs) return;
  // A worker that waited for a core before this step has had that much of its head start.
  const auto head =
      static_cast<std::int64_t>(step_offset_ * static_cast<double>(window)) - credit_ns_;
  if (head <= 0) return;
  clock_.sleepFor(head);
  const std::int64_t slept = clock_.nowNanos() - start;
  credit_ns_ += slept;
  padded_ns_.fetch_add(slept, std::memory_order_relaxed);
}

std::int64_t SpeedEmulator::takeHostDelay() {
  if (delay_mark_ns_ < 0) return 0;
  const std::int64_t now = clock_.threadRunDelayNanos();
  const std::int64_t delay = now < 0 ? 0 : std::max<std::int64_t>(0, now - delay_mark_ns_);
  delay_mark_ns_ = -1;
  return delay;
}

void SpeedEmulator::markHostDelay() {
  // Only a padded CPU worker can give back time it waited for a core: its padding is the slack.
  if (basis_ == TimeBasis::kThreadCpu && emulated()) delay_mark_ns_ = clock_.threadRunDelayNanos();
}

EmulationTotals SpeedEmulator::totals() const {
  EmulationTotals totals;
  totals.compute_seconds = toSeconds(compute_ns_.load(std::memory_order_relaxed));
  totals.padded_seconds = toSeconds(padded_ns_.load(std::memory_order_relaxed));
  totals.phases = phases_.load(std::memory_order_relaxed);
  totals.pad_points = pad_points_.load(std::memory_order_relaxed);
  totals.host_delay_seconds = toSeconds(delay_ns_.load(std::memory_order_relaxed));
  return totals;
}

double SpeedEmulator::finishPhase(double compute_seconds, std::int64_t owed_ns, bool pad) {
  compute_ns_.fetch_add(toNanos(compute_seconds), std::memory_order_relaxed);
  phases_.fetch_add(1, std::memory_order_relaxed);
  step_target_ns_ += toNanos(compute_seconds / speed_);
  const std::int64_t slept = pad && emulated() ? sleepOwed(owed_ns) : 0;
  markHostDelay();
  return toSeconds(slept);
}

std::int64_t SpeedEmulator::sleepOwed(std::int64_t owed_ns) {
  // Sleep taken before the step (beginStep) is part of what is owed. Sleep wakes late by tens of
  // microseconds; repaying that from the next pad keeps the total padding at
  // (1/speed - 1) x compute even over thousands of millisecond-long phases.
  std::int64_t owed = std::max<std::int64_t>(0, owed_ns);
  const std::int64_t credit = std::min(credit_ns_, owed);
  credit_ns_ -= credit;
  owed -= credit + overshoot_ns_;
  if (owed <= 0) {
    overshoot_ns_ = -owed;
    return 0;
  }
  const std::int64_t start = clock_.nowNanos();
  clock_.sleepFor(owed);
  const std::int64_t slept = clock_.nowNanos() - start;
  overshoot_ns_ = std::max<std::int64_t>(0, slept - owed);
  padded_ns_.fetch_add(slept, std::memory_order_relaxed);
  return slept;
}

}  // namespace chorus::device
