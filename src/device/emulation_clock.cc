#include "chorus/device/emulation_clock.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

namespace chorus::device {
namespace {

class HostClock final : public EmulationClock {
 public:
  std::int64_t nowNanos() override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  std::int64_t threadCpuNanos() override {
    timespec now{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    return static_cast<std::int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
  }

  // The second field of /proc/thread-self/schedstat (kernel sched_info).
  std::int64_t threadRunDelayNanos() override {
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

  void sleepFor(std::int64_t nanos) override {
    std::this_thread::sleep_for(std::chrono::nanoseconds(nanos));
  }
};

}  // namespace

EmulationClock& EmulationClock::host() {
  // Stateless: nothing here is mutable state, only the host's clocks behind an interface.
  static HostClock clock;
  return clock;
}

}  // namespace chorus::device
