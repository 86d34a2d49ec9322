// The device catalog: what the planner knows about each kind of accelerator.
//
// A cluster description names its devices by type ("A100-80", "V100-32", "MI300X", "CPU"); the
// catalog turns a type into peak throughput per data type, memory and memory bandwidth, the figures
// the cost model scales by an achievable fraction. Figures are vendor datasheet peaks for dense
// math (no structured sparsity); each is cited in src/plan/cluster/device_catalog.cc. A cluster
// file may define further types (for example the local devices as `chorus devices` measured them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace chorus::plan {

// The arithmetic formats a rank may train in. kTf32 is fp32 storage with tensor-core matmuls.
enum class Dtype { kFp32, kTf32, kBf16, kFp16 };

constexpr int kDtypeCount = 4;

// "fp32", "tf32", "bf16", "fp16".
const char* toString(Dtype dtype);
// Parses the names above; throws ConfigError naming the known ones.
Dtype parseDtype(const std::string& name);
// Bytes of one element stored in `dtype` (tf32 is stored as fp32).
inline int bytesOf(Dtype dtype) { return dtype == Dtype::kBf16 || dtype == Dtype::kFp16 ? 2 : 4; }

// Whether a kind of device is a GPU-like accelerator or a host CPU; the cost model gives CPUs
// their own default efficiencies and memory reserve.
enum class DeviceClass { kGpu, kCpu };

// One type of device. Value type.
struct DeviceType {
  std::string name;    // catalog key, e.g. "A100-80"
  std::string vendor;  // "NVIDIA", "AMD", "Intel", or as a cluster file says
  DeviceClass device_class = DeviceClass::kGpu;
  std::uint64_t memory_bytes = 0;
  // Peak memory bandwidth in bytes per second.
  double memory_bandwidth = 0;
  // Peak dense throughput in FLOP/s per Dtype (indexed by the enum); 0 where unsupported.
  double peak_flops[kDtypeCount] = {0, 0, 0, 0};
  // Fraction of the peaks a training step reaches, when the type knows it better than the cost
  // model's defaults (a type measured by `chorus devices` states achieved matmul rates, not
  // datasheet peaks, so it carries 1). 0 = the cost model's default for the class. Default: 0.
  double efficiency = 0;
  // Fraction of one host core a worker of this type keeps busy while it computes: an emulated
  // `cpu@0.5` computes half the time and sleeps the rest. Only CPU workers that share a node's
  // cores look at it (Node::core_contention). Default: 1.
  double core_fraction = 1;

  double peak(Dtype dtype) const { return peak_flops[static_cast<int>(dtype)]; }
  bool supports(Dtype dtype) const { return peak(dtype) > 0; }
};

// The built-in catalog, in a fixed order (NVIDIA data-center, NVIDIA consumer, AMD, CPU).
const std::vector<DeviceType>& deviceCatalog();

// Looks a type up by name, case-insensitively; nullptr when unknown.
const DeviceType* findDeviceType(const std::string& name);

// Comma-separated catalog names, for error messages ("V100-16, V100-32, ...").
std::string knownDeviceTypes();

}  // namespace chorus::plan
