#include "chorus/device/host_sharing.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>

#include "chorus/core/error.h"

namespace chorus::device {
namespace {

// staggerOffsets: the busiest a core is made by turns taken to keep workers from computing at
// once while other cores are idle; the rest of its window is slack between the turns.
constexpr double kSharedFill = 0.8;

}  // namespace

int niceFor(double speed) {
  const double nice = std::round(5.0 * std::log2(1.0 / speed));
  return static_cast<int>(std::clamp(nice, 0.0, 19.0));
}

int lowerThreadPriority(double speed) {
  const int nice = niceFor(speed);
  // On Linux the nice value belongs to the thread (PRIO_PROCESS, 0 names the caller's thread),
  // and threads inherit it from the thread that starts them.
  (void)::setpriority(PRIO_PROCESS, 0, nice);
  return nice;
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

std::vector<int> intraOpThreads(const std::vector<bool>& cpu, const std::vector<double>& speeds,
                                int cores, int requested) {
  CHORUS_CHECK_CONFIG(cpu.size() == speeds.size(), "intraOpThreads: ", cpu.size(), " workers but ",
                      speeds.size(), " speeds");
  CHORUS_CHECK_CONFIG(requested >= 0, "cpu_threads must be >= 0 (0 = auto), got ", requested);
  std::vector<size_t> full;  // CPU workers at full speed
  bool emulation = false;
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (cpu[i] && speeds[i] >= 1.0) full.push_back(i);
    emulation = emulation || (cpu[i] && speeds[i] < 1.0);
  }
  std::vector<int> threads(cpu.size(), 1);
  if (full.empty() || (emulation && requested == 0)) return threads;
  const int workers = static_cast<int>(cpu.size());
  const int spare = std::max(0, cores - workers);
  const int each = spare / static_cast<int>(full.size());
  const int remainder = spare % static_cast<int>(full.size());
  for (size_t k = 0; k < full.size(); ++k)
    threads[full[k]] =
        requested > 0 ? requested : 1 + each + (static_cast<int>(k) < remainder ? 1 : 0);
  return threads;
}

std::vector<int> intraOpThreads(const std::vector<DeviceSpec>& devices, int cores, int requested) {
  std::vector<bool> cpu;
  std::vector<double> speeds;
  for (const DeviceSpec& device : devices) {
    cpu.push_back(device.kind == DeviceKind::kCpu);
    speeds.push_back(device.speed);
  }
  return intraOpThreads(cpu, speeds, cores, requested);
}

}  // namespace chorus::device
