#include "chorus/device/speed_emulator.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <thread>

#include "chorus/core/error.h"

namespace chorus::device {
namespace {

using SteadyClock = std::chrono::steady_clock;

// staggerOffsets: the busiest a core is made by turns taken to keep workers from computing at
// once while other cores are idle; the rest of its window is slack between the turns.
constexpr double kSharedFill = 0.8;

// The shortest step whose turns are staggered (SpeedEmulator::beginStep).
constexpr std::chrono::nanoseconds kMinStaggeredStep = std::chrono::milliseconds(20);

std::int64_t toNanos(double seconds) { return static_cast<std::int64_t>(seconds * 1e9); }
double toSeconds(std::int64_t nanos) { return static_cast<double>(nanos) * 1e-9; }

std::int64_t threadCpuNanos() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<std::int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

// Nanoseconds the calling thread has spent runnable but waiting for a CPU: the second field of
// /proc/thread-self/schedstat (kernel sched_info). -1 where the kernel does not report it.
std::int64_t threadRunDelayNanos() {
  const int fd = ::open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char text[128];
  const ssize_t got = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  if (got <= 0) return -1;
  text[got] = '\0';
  unsigned long long on_cpu = 0, waiting = 0;
  if (std::sscanf(text, "%llu %llu", &on_cpu, &waiting) != 2) return -1;
  return static_cast<std::int64_t>(waiting);
}

}  // namespace

SpeedEmulator::ComputeScope::ComputeScope(SpeedEmulator* owner)
    : owner_(owner),
      start_(SteadyClock::now()),
      cpu_start_ns_(owner->basis_ == TimeBasis::kThreadCpu ? threadCpuNanos() : 0),
      uncaught_at_start_(std::uncaught_exceptions()) {}

SpeedEmulator::ComputeScope::ComputeScope(ComputeScope&& other) noexcept
    : owner_(other.owner_),
      start_(other.start_),
      cpu_start_ns_(other.cpu_start_ns_),
      device_seconds_(other.device_seconds_),
      paused_at_(other.paused_at_),
      excluded_(other.excluded_),
      slept_(other.slept_),
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
  paused_at_ = SteadyClock::now();
}

void SpeedEmulator::ComputeScope::resume() {
  if (!paused_) return;
  paused_ = false;
  excluded_ += SteadyClock::now() - paused_at_;
}

void SpeedEmulator::ComputeScope::excludeWait(double seconds) {
  if (seconds <= 0) return;
  excluded_ +=
      std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(seconds));
}

double SpeedEmulator::ComputeScope::computeSeconds() const {
  // A blocked wait uses no CPU, so the CPU clock excludes waits by itself.
  if (owner_->basis_ == TimeBasis::kThreadCpu) return toSeconds(threadCpuNanos() - cpu_start_ns_);
  return wallSeconds();
}

double SpeedEmulator::ComputeScope::wallSeconds() const {
  // A phase that ends while paused ends its wait at the same moment.
  const auto now = SteadyClock::now();
  auto excluded = excluded_;
  if (paused_) excluded += now - paused_at_;
  const auto compute = std::max(SteadyClock::duration::zero(), (now - start_) - excluded - slept_);
  return std::chrono::duration<double>(compute).count();
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
  const auto start = SteadyClock::now();
  const std::int64_t slept = owner_->sleepOwed(owed);
  slept_ += SteadyClock::now() - start;
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

SpeedEmulator::SpeedEmulator(double speed, TimeBasis basis) : speed_(speed), basis_(basis) {
  CHORUS_CHECK_CONFIG(speed > 0 && speed <= 1, "emulated speed must be in (0, 1], got ", speed);
}

double SpeedEmulator::paddingFor(double compute_seconds) const {
  return (1.0 / speed_ - 1.0) * std::max(0.0, compute_seconds);
}

int SpeedEmulator::niceFor(double speed) {
  const double nice = std::round(5.0 * std::log2(1.0 / speed));
  return static_cast<int>(std::clamp(nice, 0.0, 19.0));
}

int SpeedEmulator::yieldCoreToFasterDevices() const {
  if (basis_ != TimeBasis::kThreadCpu) return 0;
  const int nice = niceFor(speed_);
  // On Linux the nice value belongs to the thread (PRIO_PROCESS, 0 names the caller's thread),
  // and threads inherit it from the thread that starts them.
  (void)::setpriority(PRIO_PROCESS, 0, nice);
  return nice;
}

void SpeedEmulator::setStepOffset(double fraction) {
  CHORUS_CHECK_CONFIG(fraction >= 0 && fraction <= 1 - speed_ + 1e-9,
                      "emulated step offset must be in [0, 1 - speed] = [0, ", 1 - speed_,
                      "], got ", fraction);
  step_offset_ = std::max(0.0, std::min(fraction, 1 - speed_));
}

void SpeedEmulator::beginStep() {
  const auto start = SteadyClock::now();
  const std::int64_t delay = takeHostDelay();
  std::int64_t window = 0;
  bool paused = false;
  if (step_began_) {
    // The turns are fractions of the step, so the previous step's length places this one, not
    // this device's own compute: a device with a small share would otherwise take its turn
    // early, inside the turn before it, be slowed by sharing the core, look slower still to the
    // balancer and lose more of its share. At most twice its own emulated compute, so that a
    // pause between steps (an evaluation, a checkpoint) does not become a sleep.
    const std::int64_t interval =
        std::chrono::duration_cast<std::chrono::nanoseconds>(start - last_step_began_).count();
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
  last_step_began_ = start;
  // Turns much shorter than the scheduler's time slices (a few milliseconds) cannot be kept apart:
  // the head start only adds a wake-up to each step (a 5 ms MLP step grew 40%).
  if (step_offset_ <= 0 || window < kMinStaggeredStep.count()) return;
  // A worker that waited for a core before this step has had that much of its head start.
  const auto head =
      static_cast<std::int64_t>(step_offset_ * static_cast<double>(window)) - credit_ns_;
  if (head <= 0) return;
  std::this_thread::sleep_for(std::chrono::nanoseconds(head));
  const std::int64_t slept =
      std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now() - start).count();
  credit_ns_ += slept;
  padded_ns_.fetch_add(slept, std::memory_order_relaxed);
}

std::int64_t SpeedEmulator::takeHostDelay() {
  if (delay_mark_ns_ < 0) return 0;
  const std::int64_t now = threadRunDelayNanos();
  const std::int64_t delay = now < 0 ? 0 : std::max<std::int64_t>(0, now - delay_mark_ns_);
  delay_mark_ns_ = -1;
  return delay;
}

void SpeedEmulator::markHostDelay() {
  // Only a padded CPU worker can give back time it waited for a core: its padding is the slack.
  if (basis_ == TimeBasis::kThreadCpu && emulated()) delay_mark_ns_ = threadRunDelayNanos();
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
  const auto start = SteadyClock::now();
  std::this_thread::sleep_for(std::chrono::nanoseconds(owed));
  const std::int64_t slept =
      std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now() - start).count();
  overshoot_ns_ = std::max<std::int64_t>(0, slept - owed);
  padded_ns_.fetch_add(slept, std::memory_order_relaxed);
  return slept;
}

std::vector<double> staggerOffsets(const std::vector<double>& speeds, int cores) {
  constexpr double kSlack = 1e-9;
  std::vector<double> offsets(speeds.size(), 0.0);
  if (cores < 1) return offsets;
  std::vector<size_t> order(speeds.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&speeds](size_t a, size_t b) { return speeds[a] > speeds[b]; });
  const auto speedOf = [&speeds](size_t worker) { return std::clamp(speeds[worker], 0.0, 1.0); };
  struct Core {
    double filled = 0;
    std::vector<size_t> workers;
  };
  std::vector<Core> used;
  for (size_t worker : order) {
    const double speed = speedOf(worker);
    // The fullest core that keeps kSharedFill of its window or less busy: workers that can take
    // turns do, even while other cores are idle, so that fewer compute at once.
    Core* fullest = nullptr;
    for (Core& core : used)
      if (core.filled + speed <= kSharedFill + kSlack &&
          (fullest == nullptr || core.filled > fullest->filled))
        fullest = &core;
    if (fullest == nullptr && static_cast<int>(used.size()) < cores) {
      used.push_back({speed, {worker}});
      continue;
    }
    if (fullest == nullptr) {
      // Every core is taken: the one with the most room, so that turns spread over the cores.
      auto emptiest = std::min_element(used.begin(), used.end(), [](const Core& a, const Core& b) {
        return a.filled < b.filled;
      });
      if (emptiest->filled + speed > 1 + kSlack) continue;  // no room: computes at once
      fullest = &*emptiest;
    }
    fullest->filled += speed;
    fullest->workers.push_back(worker);
  }
  // The room a core has left goes between its turns and after the last, so that a turn that runs
  // a little long (shares change, the host is noisy) does not reach the next.
  for (const Core& core : used) {
    const double gap = std::max(0.0, 1 - core.filled) / static_cast<double>(core.workers.size());
    double start = 0;
    for (size_t worker : core.workers) {
      offsets[worker] = start;
      start += speedOf(worker) + gap;
    }
  }
  return offsets;
}

}  // namespace chorus::device
