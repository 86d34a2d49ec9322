// Speed emulation: makes a worker behave like a slower device by padding its compute phases with
// sleep, so heterogeneous clusters can be tested on one homogeneous machine
// (docs/architecture.md, "Emulated heterogeneity"). A spec `cpu@0.5` runs every compute phase at
// twice its real time.
//
// Only compute is padded. Time spent waiting for peers inside a phase (a backward pass whose
// gradient all-reduce overlaps it) must be excluded through pauseForWait()/resume() or
// excludeWait(): padding a wait would lengthen the peer's next wait in turn, and the job would slow
// down step after step.
//
// A phase's gradients are released at the emulated pace, not all at its end: a trainer notes how
// much compute a phase had done when each gradient bucket became ready (computeSoFar()), keeps
// the bucket's all-reduce back, and after the real compute releases each one at the moment the
// emulated device would have reached that point (padTo()). Why: padded only at its end, a slow
// rank's all-reduces would run inside its final sleep and communication that costs time on a
// really slow device would look free. Why not sleep in the middle of the compute instead: on a
// shared host the real compute then comes in bursts spread over the whole emulated phase, which
// overlap the other workers' turns (staggerOffsets) and cool the caches; measured on a 2-core
// host, a cpu@0.5 worker's CPU time per sample rose 20% over the same worker alone.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "chorus/device/emulation_clock.h"

namespace chorus::device {

// What a phase's compute time is measured in.
enum class TimeBasis {
  // Wall time, waits excluded: right for GPUs, whose work the host thread only waits for.
  kWall,
  // The thread's CPU time: an emulated CPU device is `speed` x one dedicated core of this host.
  // When several emulated devices share fewer cores than they have threads (3 workers on 2
  // cores), wall time also counts the time a worker was descheduled for another, which depends on
  // how the phases of all workers happen to overlap; CPU time does not, so the emulated speeds
  // stay the speeds the specs say.
  kThreadCpu,
};

// Running totals of one emulator, for metrics. Value type.
struct EmulationTotals {
  // Real wall time of compute phases, waits excluded.
  double compute_seconds = 0;
  // Time slept to emulate the slower device (measured, so sleep overshoot is included).
  double padded_seconds = 0;
  // Compute phases ended.
  std::int64_t phases = 0;
  // ComputeScope::padTo() calls in phases of an emulated device, whether or not they had to
  // sleep: how many points of the phases were released at the emulated pace (a trainer releases
  // each gradient bucket's all-reduce at one).
  std::int64_t pad_points = 0;
  // Time the worker waited for a core between steps and got back from its padding
  // (SpeedEmulator::beginStep).
  double host_delay_seconds = 0;
};

// Pads compute phases of one worker to 1/speed of their real time.
//
// Ownership and threads: one SpeedEmulator per worker, owned by the worker and used by its training
// thread; phases do not nest and are not shared between threads. totals() may be read from any
// thread (a metrics exporter) while phases run. The emulator must outlive its scopes.
//
// Timing is the clock's (EmulationClock: the host's wall and thread-CPU clocks, or a test's). For
// CUDA work, which is asynchronous, the caller must synchronize the device
// (torch::cuda::synchronize) before a phase ends, or only the kernel launches are measured.
class SpeedEmulator {
 public:
  // RAII compute phase: starts timing on construction and pads when it ends (end() or the
  // destructor). Move-only. A scope destroyed while an exception unwinds ends without padding, so
  // an error reaches recovery without an artificial delay.
  class ComputeScope {
   public:
    ComputeScope(ComputeScope&& other) noexcept;
    ComputeScope& operator=(ComputeScope&&) = delete;
    ComputeScope(const ComputeScope&) = delete;
    ComputeScope& operator=(const ComputeScope&) = delete;
    ~ComputeScope();

    // Marks the start and end of a wait for peers inside the phase; the wait is not padded.
    // REQUIRES: calls alternate, pauseForWait() first.
    void pauseForWait();
    void resume();
    // Excludes a wait the caller timed itself (e.g. a Work's wait time). Clamped at the phase's
    // elapsed time, so the compute time never turns negative.
    void excludeWait(double seconds);
    // The compute the phase has done so far, waits and pads excluded, in the emulator's time
    // basis: a point of the phase that padTo() can release later. In the kThreadCpu basis only on
    // the owner's thread, whose CPU clock it reads; otherwise from any thread (autograd runs a
    // CUDA backward's hooks on its device threads).
    double computeSoFar() const;
    // Sleeps until the emulated device would have done `compute_seconds` of the phase's compute:
    // until compute_seconds / speed of the phase have passed, waits excluded, counting sleep taken
    // before the phase (beginStep's head start) and by earlier padTo() calls. Returns the seconds
    // slept; 0 when that moment has passed already, while paused for a wait, at full speed, or
    // after end(). end() later pads only the rest, and deviceSeconds() still covers the whole
    // phase. Uses the same sleep-overshoot carry as end(). Training thread only. Why: see the file
    // comment; a trainer calls it after the real compute, once per gradient bucket, with the
    // computeSoFar() noted when the bucket became ready, and launches the bucket right after.
    double padTo(double compute_seconds);
    // Ends the phase now: sleeps the rest of the padding (what padTo() has not slept yet) and
    // returns the seconds slept by this call. Later calls return 0.
    double end();
    // After end(): how long the phase took on the emulated device, waits excluded: compute /
    // speed (compute in the emulator's time basis), or the phase's wall time before padding when
    // that is longer — a worker that lost its core for longer than its padding absorbs really
    // held the step up that long (in kThreadCpu, a full-speed worker always does). What a load
    // balancer should see.
    double deviceSeconds() const { return device_seconds_; }

   private:
    friend class SpeedEmulator;
    explicit ComputeScope(SpeedEmulator* owner);
    double computeSeconds() const;
    double wallSeconds() const;
    // Padding owed for the phase up to the point where `compute_seconds` were done, at
    // `wall_seconds` into it, and not settled by padTo() yet, in nanoseconds.
    std::int64_t owedSoFar(double compute_seconds, double wall_seconds);

    SpeedEmulator* owner_;
    // Times in nanoseconds of the owner's clock.
    std::int64_t start_ns_ = 0;
    std::int64_t cpu_start_ns_ = 0;
    double device_seconds_ = 0;
    std::int64_t paused_at_ns_ = 0;
    std::int64_t excluded_ns_ = 0;
    // Sleep taken by padTo(): excluded from the phase's compute and wall time like a wait.
    std::int64_t slept_ns_ = 0;
    // Padding of the phase settled by padTo() (before credit and overshoot), in nanoseconds: the
    // padding of the phase up to the last point released, so that the next pads only what
    // follows.
    std::int64_t settled_ns_ = 0;
    bool paused_ = false;
    int uncaught_at_start_;
  };

  // REQUIRES: 0 < speed <= 1 (throws ConfigError otherwise). speed 1.0 measures but never sleeps.
  // `basis`: see TimeBasis. Default: kWall. `clock`: not owned, must outlive the emulator.
  // Default: EmulationClock::host().
  explicit SpeedEmulator(double speed, TimeBasis basis = TimeBasis::kWall,
                         EmulationClock& clock = EmulationClock::host());
  SpeedEmulator(const SpeedEmulator&) = delete;
  SpeedEmulator& operator=(const SpeedEmulator&) = delete;

  // Begins a compute phase.
  [[nodiscard]] ComputeScope compute() { return ComputeScope(this); }

  double speed() const { return speed_; }
  TimeBasis basis() const { return basis_; }
  bool emulated() const { return speed_ != 1.0; }
  // Sleep owed for a phase of `compute_seconds` real time: (1/speed - 1) x compute_seconds.
  double paddingFor(double compute_seconds) const;

  // Lowers the CPU priority of the calling thread, and of the threads it starts later, the slower
  // this device is (device::lowerThreadPriority in host_sharing.h says why). Does nothing in the
  // kWall basis (GPUs). Returns the nice value asked for (0 in kWall).
  int yieldCoreToFasterDevices() const;

  // Where in each training step this device does its real compute, as the fraction of the step's
  // emulated compute time it sleeps *before* computing (the rest of the padding follows the
  // compute as usual). Default 0: compute first, then pad. See staggerOffsets() (host_sharing.h)
  // for why.
  // REQUIRES: 0 <= fraction <= 1 - speed (throws ConfigError): the compute must fit the window.
  void setStepOffset(double fraction);
  double stepOffset() const { return step_offset_; }
  // Marks the start of a training step, before its first compute phase: with a step offset, sleeps
  // offset x the previous step's length (from beginStep() to beginStep(), at most twice this
  // device's emulated compute in it) and counts that sleep against the padding of this step's
  // phases, so they still end at compute / speed in all when the turn fits the window. A turn
  // that does not (the step grew shorter, or this device computes much less than the step
  // lasts) ends late, but its phases' deviceSeconds() never include the sleep before them.
  // Steps shorter than 20 ms are not staggered: turns shorter than the scheduler's time slices
  // cannot be kept apart, and the sleep would only add a wake-up. Unused credit is dropped at the
  // next beginStep(). Training thread only.
  //
  // A padded worker in the kThreadCpu basis also gets back the time it waited for a core since
  // its last phase ended (runnable but not running: the kernel's per-thread run delay, from
  // /proc/thread-self/schedstat; 0 where the kernel does not report it). Why: an emulated device
  // stands for a device with a core of its own, whose step starts when the previous step's
  // collectives end. On a shared host the slowest worker, at the lowest priority, arrives last at
  // those collectives, wakes the others, and they take the cores from it: it left the previous
  // step 2-3 ms after them (3 workers on 2 cores), and without this every step ended that much
  // later. The wait shortens the head start and counts against the padding like it, so it never
  // makes a step shorter than the worker's real compute. After a pause (see above) nothing is
  // given back: a wait for a core during an evaluation on every worker is not the step's.
  void beginStep();
  EmulationTotals totals() const;

 private:
  // Records a finished phase and sleeps the rest of its padding, `owed_ns` (ComputeScope::
  // owedSoFar); returns the seconds actually slept. The padding brings the phase's wall time
  // (waits and earlier pads excluded) to compute / speed.
  double finishPhase(double compute_seconds, std::int64_t owed_ns, bool pad);
  // Sleeps `owed_ns` less the step's credit and the carried overshoot; returns nanoseconds slept.
  std::int64_t sleepOwed(std::int64_t owed_ns);
  // The run delay (see beginStep) since markHostDelay(), once; 0 when nothing was marked.
  std::int64_t takeHostDelay();
  void markHostDelay();

  const double speed_;
  const TimeBasis basis_;
  EmulationClock& clock_;
  // Sleep overshoot carried into the next phase, in nanoseconds (training thread only), so that
  // padding stays exact over many short phases even though each sleep wakes late.
  std::int64_t overshoot_ns_ = 0;
  // Staggering (training thread only): the step offset; the emulated compute (compute / speed)
  // of this step's phases so far and of the previous step; sleep taken before this step's
  // phases and not yet counted against their padding.
  double step_offset_ = 0;
  std::int64_t step_target_ns_ = 0;
  std::int64_t last_step_target_ns_ = 0;
  std::int64_t credit_ns_ = 0;
  bool step_began_ = false;
  std::int64_t last_step_began_ns_ = 0;
  // The thread's run delay when its last phase ended, or -1 (training thread only).
  std::int64_t delay_mark_ns_ = -1;
  std::atomic<std::int64_t> delay_ns_{0};
  std::atomic<std::int64_t> compute_ns_{0};
  std::atomic<std::int64_t> padded_ns_{0};
  std::atomic<std::int64_t> phases_{0};
  std::atomic<std::int64_t> pad_points_{0};
};

}  // namespace chorus::device
