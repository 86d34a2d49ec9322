// Device specs: how a user names the devices a job runs on.
//
// Grammar (a list is comma-separated, whitespace around items ignored):
//   auto                    every local GPU, or CPU workers on a CPU-only host (see device layer)
//   cpu                     a CPU worker
//   cuda:N                  CUDA (or ROCm, which libtorch exposes as cuda) device N
//   <device>@S              emulated speed S in [0.001, 1]: compute phases are padded to 1/S their
//                           time (below 0.001 a millisecond of work would sleep for seconds, and a
//                           speed like 1e-300 would overflow the padding)
//   <device>/SIZE           a memory budget (e.g. 512MiB, 20GiB) enforced by the device layer
//   e.g. cpu@0.5/512MiB, cuda:1/20GiB, cuda:0@0.5
// Parsing is pure: it knows nothing about which devices exist (that is the device layer's job).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace chorus {

enum class DeviceKind { kAuto, kCpu, kCuda };

// The slowest emulated speed a spec may ask for: a device a thousand times slower than its host.
constexpr double kMinEmulatedSpeed = 0.001;

const char* toString(DeviceKind kind);

// One parsed device spec. Value type.
struct DeviceSpec {
  DeviceKind kind = DeviceKind::kCpu;
  // Device index for kCuda; -1 for kCpu and kAuto.
  int index = -1;
  // Emulated speed relative to the real device. Default: 1.0 (no emulation).
  double speed = 1.0;
  // Memory budget in bytes. Default: none (the device's real memory).
  std::optional<std::uint64_t> memory_budget;

  bool emulated() const { return speed != 1.0 || memory_budget.has_value(); }
  // Canonical text that parses back to an equal spec, e.g. "cpu@0.5/512MiB".
  std::string toString() const;
  bool operator==(const DeviceSpec& other) const;
};

// Parses one spec. Throws ConfigError quoting `text` and saying what is expected.
DeviceSpec parseDeviceSpec(const std::string& text);

// Parses a comma-separated list; an empty list or an empty item is an error. `auto` may only
// appear alone.
std::vector<DeviceSpec> parseDeviceSpecs(const std::string& text);

// Formats a list back to its canonical comma-separated text.
std::string toString(const std::vector<DeviceSpec>& specs);

}  // namespace chorus
