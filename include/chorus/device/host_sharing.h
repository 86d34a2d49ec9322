// How emulated devices share the host's cores (docs/architecture.md, "Emulated heterogeneity"):
// real devices share nothing, but emulated ones share cores, caches and memory bandwidth. Two
// policies keep that sharing from changing what is measured: the workers take turns within a step
// (step offsets), and the slower a device, the lower its CPU priority (the one with the least
// slack gets the core). A SpeedEmulator applies both (setStepOffset, yieldCoreToFasterDevices);
// the agent computes the offsets for the workers of its node.
#pragma once

#include <vector>

#include "chorus/core/device_spec.h"

namespace chorus::device {

// The nice value of a worker at emulated `speed`: round(5 x log2(1 / speed)), at most 19
// (cpu@0.5 -> 5, cpu@0.25 -> 10). Why: emulated devices share the host's cores, but only padded
// workers have slack. In the thread-CPU time basis a padded worker that is descheduled in a phase
// still finishes it at compute / speed (the wait comes out of its sleep), whereas a worker at full
// speed, or one with less padding, is late by as long as it waited, and so is every step that
// waits for it. Real devices do not share cores; handing the core to the worker with the least
// slack is the closer emulation.
int niceFor(double speed);

// Sets the calling thread's nice value to niceFor(speed) (threads it starts later inherit it) and
// returns it. A failure (raising a priority again needs CAP_SYS_NICE) is ignored: the priority
// is a hint.
int lowerThreadPriority(double speed);

// Step offsets (SpeedEmulator::setStepOffset) for emulated CPU workers of the given speeds on a
// host with `cores` cores, in the order given. Why: emulated devices stand for devices that share
// nothing, but here they share the host's cores, caches and memory, and in data parallelism every
// worker starts its compute at the same moment (right after the previous step's all-reduce). With
// more workers than cores they then all compute at once: they are switched in and out of the
// cores and, more costly, evict each other's caches (measured on a 2-core host, cpu@1,cpu@0.5,
// cpu@0.25: each worker's CPU time per sample rose 7-25% over the same worker alone). Even on
// separate cores two workers computing at once slow each other through the shared L3 and memory
// (cpu@0.332 took 2.25 ms a sample in a job beside cpu@0.223 against 1.75-2.0 alone). A padded
// worker may do its compute anywhere in its emulated window, so the workers take turns instead:
// each core is a bin of capacity 1 (one step's window); workers in descending speed go to the
// fullest core they fit on while it stays at most 0.8 busy (0.2 kept as slack), else to a core of
// their own while one is left, else to the core with the most room; a core's spare time is split
// evenly after each of its turns, so that a turn that runs a little long does not reach the next
// (cpu@1 | cpu@0.5 at 0, cpu@0.25 at 0.625; cpu@0.522 at 0, cpu@0.077 at 0.7225, on any number
// of cores). A worker that fits nowhere gets 0.
std::vector<double> staggerOffsets(const std::vector<double>& speeds, int cores);

// Intra-op threads of each worker of a node with `cores` cores, in the order given; `cpu[i]`
// says whether worker i computes on the CPU and `speeds[i]` is its emulated speed. Why: a worker
// computes on one core, so a GPU's worker leaves the node's other cores idle, and a CPU device
// beside a GPU can use them, and a job of one CPU computes on every core (PyTorch's default).
// `requested` > 0 gives every CPU worker at full speed that many threads; 0 (auto) shares the
// cores left over after one per worker evenly among them (the first ones get the remainder),
// unless a CPU worker of the node is emulated (speed < 1): then the node is an emulation, whose
// speeds are in units of one core (an emulated worker's speed comes from its one thread's CPU
// time), and every worker keeps one. Every other worker gets 1. Throws ConfigError for
// `requested` < 0 or sizes that differ.
std::vector<int> intraOpThreads(const std::vector<bool>& cpu, const std::vector<double>& speeds,
                                int cores, int requested);
// The same for a node's device specs (their kinds and emulated speeds).
std::vector<int> intraOpThreads(const std::vector<DeviceSpec>& devices, int cores, int requested);

}  // namespace chorus::device
