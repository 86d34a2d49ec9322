// The GPU half of device discovery: every CUDA or ROCm device libtorch can see, with the properties
// the planner and `chorus devices` need.
//
// Counting GPUs needs only libtorch (torch::cuda::device_count() is 0 on a host without a GPU or
// driver, even with a CUDA build). Their properties need the CUDA runtime headers, which exist
// wherever the toolkit does; without them (a CPU-only libtorch, or a toolchain without the
// toolkit) GPUs are still listed, with name and memory unknown, so specs naming them validate.
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>

#include <cstdio>
#include <string>
#include <vector>

#include "chorus/core/error.h"
#include "chorus/device/discovery.h"

#if __has_include(<cuda_runtime_api.h>)
#include <ATen/cuda/CUDAContext.h>
#define CHORUS_HAVE_CUDA_PROPERTIES 1
#else
#define CHORUS_HAVE_CUDA_PROPERTIES 0
#endif

namespace chorus::device::detail {
namespace {

// Dtypes with hardware support worth planning for: tf32 and bf16 need Ampere (8.0) tensor cores;
// fp16 is fast from Volta (7.0) and on P100 (6.0), but runs at 1/64 rate on other Pascal parts.
std::vector<std::string> nvidiaDtypes(int major, int minor) {
  std::vector<std::string> dtypes{"fp32"};
  if (major >= 8) dtypes.push_back("tf32");
  if (major >= 8) dtypes.push_back("bf16");
  if (major >= 7 || (major == 6 && minor == 0)) dtypes.push_back("fp16");
  return dtypes;
}

// ROCm reports major 9 for the CDNA parts (gfx90a, gfx94x) that have bf16 matrix cores.
std::vector<std::string> amdDtypes(int major) {
  std::vector<std::string> dtypes{"fp32", "fp16"};
  if (major >= 9) dtypes.push_back("bf16");
  return dtypes;
}

DeviceInfo describeGpu(int index, bool rocm) {
  DeviceInfo info;
  info.kind = DeviceKind::kCuda;
  info.index = index;
  info.rocm = rocm;
  info.vendor = rocm ? "AMD" : "NVIDIA";
#if CHORUS_HAVE_CUDA_PROPERTIES
  const auto* props = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(index));
  info.name = props->name;
  info.memory_bytes = static_cast<std::uint64_t>(props->totalGlobalMem);
  info.compute_capability = std::to_string(props->major) + "." + std::to_string(props->minor);
  info.cores = props->multiProcessorCount;
  info.dtypes = rocm ? amdDtypes(props->major) : nvidiaDtypes(props->major, props->minor);
#else
  info.name = info.vendor + " GPU " + std::to_string(index);
  info.dtypes = {"fp32"};
#endif
  return info;
}

}  // namespace

std::vector<DeviceInfo> discoverCudaDevices() {
  std::vector<DeviceInfo> found;
  try {
    const int count = static_cast<int>(torch::cuda::device_count());
    if (count == 0) return found;
    const bool rocm = at::detail::getCUDAHooks().hasROCM();
    for (int index = 0; index < count; ++index) found.push_back(describeGpu(index, rocm));
  } catch (const c10::Error& error) {
    CHORUS_THROW(DeviceError,
                 "cannot query the GPUs libtorch reports: ", error.what_without_backtrace());
  }
  return found;
}

}  // namespace chorus::device::detail

namespace chorus::device {

std::string physicalGpuId(int index) {
#if CHORUS_HAVE_CUDA_PROPERTIES
  try {
    const auto* props = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(index));
    char address[32];
    std::snprintf(address, sizeof address, "pci:%04x:%02x:%02x", props->pciDomainID,
                  props->pciBusID, props->pciDeviceID);
    return address;
  } catch (const c10::Error& error) {
    CHORUS_THROW(DeviceError, "cuda:", index,
                 ": cannot read its PCI address: ", error.what_without_backtrace());
  }
#else
  return "cuda:" + std::to_string(index);
#endif
}

}  // namespace chorus::device
