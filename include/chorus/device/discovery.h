// Device discovery: which devices this host has, and what a job's device specs turn into here.
//
// The device layer is where specs (parsed, host-agnostic, see core/device_spec.h) meet the host:
// discoverDevices() lists the CPU and every GPU libtorch can see; expandAuto() resolves `auto`;
// validateSpecs() rejects specs that name devices or budgets this host does not have, so a job
// fails at start-up with one clear ConfigError instead of deep inside a worker.
//
// libtorch exposes ROCm GPUs as `cuda` devices, so DeviceKind::kCuda covers both; `rocm` and
// `vendor` tell them apart. This header keeps libtorch out of its includes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "chorus/core/device_spec.h"

namespace chorus::device {

// What is known about one device without running anything on it. Value type.
struct DeviceInfo {
  // Marketing name: "AMD EPYC 7B13", "NVIDIA H100 80GB HBM3".
  std::string name;
  DeviceKind kind = DeviceKind::kCpu;
  // CUDA/ROCm ordinal for kCuda; -1 for the CPU.
  int index = -1;
  // "NVIDIA", "AMD", "Intel", ...; the CPU's raw vendor id when we do not know it.
  std::string vendor;
  // Total device memory (GPU) or total host memory (CPU).
  std::uint64_t memory_bytes = 0;
  // "9.0" for CUDA (major.minor); the same pair as reported by ROCm; "" for the CPU.
  std::string compute_capability;
  // Compute dtypes the device runs fast: a subset of "fp32", "tf32", "bf16", "fp16". bf16 is listed
  // for a CPU only with native bf16 instructions (avx512_bf16 or AMX), since emulated bf16 is
  // slower than fp32 and would mislead the planner.
  std::vector<std::string> dtypes;
  // True for an AMD GPU driven through ROCm/HIP.
  bool rocm = false;
  // CPU: logical cores this process may run on. GPU: streaming multiprocessors (compute units).
  int cores = 0;

  bool supports(const std::string& dtype) const;
};

// Lists the host's devices: exactly one CPU entry first, then GPUs in ordinal order. A CUDA build
// of libtorch on a host without a GPU (or driver) simply yields no GPU entries. The CPU entry never
// fails (unknown fields fall back to "unknown"/0); throws DeviceError when libtorch reports GPUs
// but cannot query their properties.
std::vector<DeviceInfo> discoverDevices();

// The most CPU workers `auto` starts on a CPU-only host.
constexpr int kMaxAutoCpuWorkers = 4;

// Returns `specs` with `auto` replaced by concrete devices of `found`: one `cuda:i` per GPU, or,
// on a CPU-only host, min(logical cores, kMaxAutoCpuWorkers) CPU workers. Each CPU worker runs one
// intra-op thread (docs/architecture.md, "Process model"), so one worker per core uses the cores
// without oversubscribing them; beyond four, extra CPU workers mostly add all-reduce traffic for
// little compute. The devices `auto` becomes are real (speed 1, no budget: the parser forbids both
// on `auto`). Other specs pass unchanged.
std::vector<DeviceSpec> expandAuto(const std::vector<DeviceSpec>& specs,
                                   const std::vector<DeviceInfo>& found);

// Throws ConfigError when a spec names a GPU this host lacks ("device spec 'cuda:3': this host has
// 1 CUDA device (cuda:0)") or asks for a memory budget larger than its device's memory. `auto` is
// checked as what it expands to.
void validateSpecs(const std::vector<DeviceSpec>& specs, const std::vector<DeviceInfo>& found);

// One line for logs and tables: "cuda:0 NVIDIA H100 (NVIDIA, 79.6 GiB, cc 9.0)".
std::string describe(const DeviceInfo& info);

// Which physical card CUDA device `index` of this process is: its PCI address ("pci:0000:3b:00"),
// the same in every process of a host whatever CUDA_VISIBLE_DEVICES numbers the devices there (a
// task given one GPU calls it cuda:0); "cuda:<index>" when this build cannot read it. Throws
// DeviceError when the device cannot be queried.
std::string physicalGpuId(int index);

namespace detail {
// The GPU half of discoverDevices(), in its own file (cuda_discovery.cc) because it needs the CUDA
// headers. Returns nothing when libtorch was built without CUDA/ROCm or no GPU is present.
std::vector<DeviceInfo> discoverCudaDevices();
// Parses /proc/cpuinfo-style text into `info` (name, vendor, dtypes). Exposed for tests.
void parseCpuInfo(const std::string& cpuinfo, DeviceInfo& info);
}  // namespace detail

}  // namespace chorus::device
