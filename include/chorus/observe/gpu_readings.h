// The GPUs of a node as its agent reads them for the Prometheus series `chorus_gpu_*`
// (node_metrics.h): what a reading holds, where readings come from (GpuSource), and the one real
// source, NVML (the NVIDIA driver's management library, loaded at run time; nvml_source.cc).
//
// NVML is opened with dlopen, never linked: a node without an NVIDIA driver (a CPU host, a CI
// runner) has no libnvidia-ml.so.1, and chorus must start there all the same. Its absence, or a
// driver with no GPU, means no GPU series: openNvml says why and the agent logs it once; it is
// never an error.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace chorus::observe {

// One GPU at one moment. Value type. A figure the GPU or driver does not report (NVML's
// NOT_SUPPORTED: power on some boards, utilization in some virtual GPUs) is nullopt, and its
// series is left out rather than shown as 0.
struct GpuReading {
  int index = 0;     // NVML's index, as nvidia-smi shows it (not CUDA's order; see `pci`)
  std::string name;  // e.g. "NVIDIA H200"
  // The PCI address in the form device::physicalGpuId gives a CUDA device, "pci:0000:1b:00":
  // the key that ties a GPU here to a rank's `cuda:N` whatever CUDA_VISIBLE_DEVICES did.
  std::string pci;
  std::optional<double> utilization;  // busy fraction of the last sample period, [0, 1]
  std::optional<std::uint64_t> memory_used_bytes;
  std::optional<std::uint64_t> memory_total_bytes;
  std::optional<double> power_watts;
};

// Where an agent's GPU readings come from: NVML on a real node, a fixed list in a test.
// read() is called from the metrics server's thread, once per scrape; it must not throw (a GPU
// that cannot be read is left out of the list).
class GpuSource {
 public:
  virtual ~GpuSource() = default;
  virtual std::vector<GpuReading> read() = 0;
};

// The outcome of opening NVML: a source, or the reason there is none.
struct NvmlOpening {
  std::unique_ptr<GpuSource> source;  // null when NVML or a GPU is absent
  std::string absent;                 // why `source` is null, e.g. "libnvidia-ml.so.1: cannot ..."
};

// The default library name: the driver's soname, what every NVIDIA driver install provides.
inline constexpr const char* kNvmlLibrary = "libnvidia-ml.so.1";

// Loads `library` with dlopen, resolves the NVML entry points it needs and initializes NVML.
// No source when the library is absent, lacks an entry point, fails to initialize (no driver
// loaded) or counts no GPU. Never throws. The source shuts NVML down when destroyed.
NvmlOpening openNvml(const std::string& library = kNvmlLibrary);

}  // namespace chorus::observe
