// NVML as a GpuSource (gpu_readings.h): libnvidia-ml.so.1 loaded with dlopen, its entry points
// looked up by name.
//
// No nvml.h: the build must not need the driver's development files (the CUDA toolkit ships
// nvml.h only in some layouts, and a CPU build has none). The few types below are NVML's stable
// C ABI: the `_v2`/`_v3` suffixed entry points are the ones nvml.h maps the plain names to, and
// NVML gives an entry point a new suffix whenever its struct changes, so a suffix fixes a layout.
#include <dlfcn.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "chorus/observe/gpu_readings.h"

namespace chorus::observe {
namespace {

using NvmlReturn = int;  // nvmlReturn_t: an enum, int-sized
constexpr NvmlReturn kNvmlSuccess = 0;
using NvmlDevice = struct NvmlDeviceOpaque*;  // nvmlDevice_t

struct NvmlUtilization {  // nvmlUtilization_t
  unsigned int gpu;       // percent of the sample period a kernel ran
  unsigned int memory;
};
struct NvmlMemory {  // nvmlMemory_t (v1)
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct NvmlPciInfo {  // nvmlPciInfo_t as nvmlDeviceGetPciInfo_v3 fills it
  char bus_id_legacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pci_device_id;
  unsigned int pci_subsystem_id;
  char bus_id[32];
};
constexpr unsigned kNameBuffer = 96;  // NVML_DEVICE_NAME_V2_BUFFER_SIZE

// The entry points, resolved once.
struct NvmlApi {
  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*shutdown)() = nullptr;
  const char* (*error_string)(NvmlReturn) = nullptr;
  NvmlReturn (*count)(unsigned int*) = nullptr;
  NvmlReturn (*handle)(unsigned int, NvmlDevice*) = nullptr;
  NvmlReturn (*name)(NvmlDevice, char*, unsigned int) = nullptr;
  NvmlReturn (*pci)(NvmlDevice, NvmlPciInfo*) = nullptr;
  NvmlReturn (*utilization)(NvmlDevice, NvmlUtilization*) = nullptr;
  NvmlReturn (*memory)(NvmlDevice, NvmlMemory*) = nullptr;
  NvmlReturn (*power)(NvmlDevice, unsigned int*) = nullptr;  // milliwatts
};

// Resolves every entry point; the name of the first one missing, or "" when all were found.
std::string resolve(void* library, NvmlApi& api) {
  const std::pair<const char*, void**> entries[] = {
      {"nvmlInit_v2", reinterpret_cast<void**>(&api.init)},
      {"nvmlShutdown", reinterpret_cast<void**>(&api.shutdown)},
      {"nvmlErrorString", reinterpret_cast<void**>(&api.error_string)},
      {"nvmlDeviceGetCount_v2", reinterpret_cast<void**>(&api.count)},
      {"nvmlDeviceGetHandleByIndex_v2", reinterpret_cast<void**>(&api.handle)},
      {"nvmlDeviceGetName", reinterpret_cast<void**>(&api.name)},
      {"nvmlDeviceGetPciInfo_v3", reinterpret_cast<void**>(&api.pci)},
      {"nvmlDeviceGetUtilizationRates", reinterpret_cast<void**>(&api.utilization)},
      {"nvmlDeviceGetMemoryInfo", reinterpret_cast<void**>(&api.memory)},
      {"nvmlDeviceGetPowerUsage", reinterpret_cast<void**>(&api.power)},
  };
  for (const auto& [name, slot] : entries) {
    *slot = ::dlsym(library, name);
    if (*slot == nullptr) return name;
  }
  return "";
}

// Owns the library handle and NVML's initialization; shuts both down when destroyed.
class NvmlSource final : public GpuSource {
 public:
  NvmlSource(void* library, const NvmlApi& api) : library_(library), api_(api) {}
  ~NvmlSource() override {
    api_.shutdown();
    ::dlclose(library_);
  }
  NvmlSource(const NvmlSource&) = delete;
  NvmlSource& operator=(const NvmlSource&) = delete;

  std::vector<GpuReading> read() override {
    std::vector<GpuReading> readings;
    unsigned int count = 0;
    if (api_.count(&count) != kNvmlSuccess) return readings;
    for (unsigned int index = 0; index < count; ++index) {
      NvmlDevice device = nullptr;
      if (api_.handle(index, &device) != kNvmlSuccess) continue;  // e.g. lost, or no permission
      readings.push_back(readOne(static_cast<int>(index), device));
    }
    return readings;
  }

 private:
  GpuReading readOne(int index, NvmlDevice device) const {
    GpuReading reading;
    reading.index = index;
    char name[kNameBuffer] = {};
    if (api_.name(device, name, kNameBuffer) == kNvmlSuccess) reading.name = name;
    NvmlPciInfo pci{};
    if (api_.pci(device, &pci) == kNvmlSuccess) {
      char address[32];
      std::snprintf(address, sizeof address, "pci:%04x:%02x:%02x", pci.domain, pci.bus, pci.device);
      reading.pci = address;
    }
    NvmlUtilization utilization{};
    if (api_.utilization(device, &utilization) == kNvmlSuccess)
      reading.utilization = utilization.gpu / 100.0;
    NvmlMemory memory{};
    if (api_.memory(device, &memory) == kNvmlSuccess) {
      reading.memory_used_bytes = memory.used;
      reading.memory_total_bytes = memory.total;
    }
    unsigned int milliwatts = 0;
    if (api_.power(device, &milliwatts) == kNvmlSuccess) reading.power_watts = milliwatts / 1000.0;
    return reading;
  }

  void* library_;
  NvmlApi api_;
};

}  // namespace

NvmlOpening openNvml(const std::string& library) {
  NvmlOpening opening;
  void* handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    opening.absent = why != nullptr ? why : library + ": cannot be loaded";
    return opening;
  }
  NvmlApi api;
  const std::string missing = resolve(handle, api);
  if (!missing.empty()) {
    opening.absent = library + " has no " + missing;
    ::dlclose(handle);
    return opening;
  }
  const NvmlReturn initialized = api.init();
  if (initialized != kNvmlSuccess) {
    opening.absent = std::string("nvmlInit failed: ") + api.error_string(initialized);
    ::dlclose(handle);
    return opening;
  }
  unsigned int count = 0;
  const NvmlReturn counted = api.count(&count);
  if (counted != kNvmlSuccess || count == 0) {
    opening.absent = counted != kNvmlSuccess
                         ? std::string("nvmlDeviceGetCount failed: ") + api.error_string(counted)
                         : std::string("NVML sees no GPU");
    api.shutdown();
    ::dlclose(handle);
    return opening;
  }
  opening.source = std::make_unique<NvmlSource>(handle, api);
  return opening;
}

}  // namespace chorus::observe
