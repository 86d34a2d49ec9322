// A CUDA device's memory budget (`cuda:1/20GiB`): libtorch's caching allocator capped at a
// fraction of the device's memory, and the allocator's figures the rank reports as its memory.
// Needs the CUDA runtime headers, as discovery's properties do (cuda_discovery.cc); without them a
// budget on a GPU is refused rather than silently ignored.
//
// libtorch creates its CUDA caching allocator's per-device state lazily, when CUDA is first used
// (CUDAHooks' init calls CUDACachingAllocator::init(device_count)); setMemoryFraction on a device
// it has not set up yet fails with "Allocator not initialized for device". A budget is applied at
// start-up, before any tensor touches the GPU, so CUDA is initialized here first.
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <cstdint>
#include <optional>

#include "chorus/core/error.h"
#include "chorus/core/units.h"
#include "chorus/device/memory_budget.h"

#if __has_include(<cuda_runtime_api.h>)
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#define CHORUS_HAVE_CUDA_ALLOCATOR 1
#else
#define CHORUS_HAVE_CUDA_ALLOCATOR 0
#endif

namespace chorus::device {

#if CHORUS_HAVE_CUDA_ALLOCATOR
namespace {

// Context::lazyInitDevice is there from PyTorch 2.6 on, where lazyInitCUDA warns as deprecated;
// before, only lazyInitCUDA. Both run CUDAHooks' init once per process, which sets the allocator
// up for every device (and is what the first CUDA tensor would run).
void initCudaOnce() {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 6)
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
#else
  at::globalContext().lazyInitCUDA();
#endif
}

}  // namespace

double capCudaMemory(int index, std::uint64_t budget_bytes) {
  CHORUS_CHECK_CONFIG(budget_bytes > 0, "cuda:", index, ": a memory budget of 0 bytes");
  std::uint64_t total = 0;
  try {
    total = static_cast<std::uint64_t>(
        at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(index))->totalGlobalMem);
  } catch (const c10::Error& error) {
    CHORUS_THROW(DeviceError, "cuda:", index, ": cannot read its memory to cap it at ",
                 formatBytes(budget_bytes), ": ", error.what_without_backtrace());
  }
  CHORUS_CHECK_CONFIG(budget_bytes <= total, "cuda:", index, ": a memory budget of ",
                      formatBytes(budget_bytes), " is more than the device's ", formatBytes(total));
  const double fraction = static_cast<double>(budget_bytes) / static_cast<double>(total);
  try {
    initCudaOnce();
    c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction,
                                                       static_cast<c10::DeviceIndex>(index));
  } catch (const c10::Error& error) {
    CHORUS_THROW(DeviceError, "cuda:", index, ": cannot cap its memory at ",
                 formatBytes(budget_bytes), ": ", error.what_without_backtrace());
  }
  return fraction;
}

std::optional<CudaMemoryFigures> cudaMemoryFigures(int index) {
  try {
    // device_count() asks the runtime without creating a context; an index past it would wrap
    // in c10's narrow DeviceIndex.
    if (index < 0 || index >= static_cast<int>(c10::cuda::device_count())) return std::nullopt;
    // Asking an allocator that CUDA's lazy init has not set up yet fails as setMemoryFraction
    // does; before that nothing was allocated, and metrics must not initialize CUDA themselves.
    if (!c10::cuda::CUDACachingAllocator::get()->initialized()) return CudaMemoryFigures{};
    const auto stats =
        c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index));
    // Entry 0 of a StatArray is StatType::AGGREGATE (all pools) in every PyTorch 2.x; the enum
    // moved namespaces between versions, its value did not.
    const auto& allocated = stats.allocated_bytes[0];
    CudaMemoryFigures figures;
    figures.allocated = static_cast<std::uint64_t>(allocated.current);
    figures.allocated_peak = static_cast<std::uint64_t>(allocated.peak);
    figures.reserved = static_cast<std::uint64_t>(stats.reserved_bytes[0].current);
    return figures;
  } catch (const c10::Error&) {
    return std::nullopt;
  }
}
#else
double capCudaMemory(int index, std::uint64_t budget_bytes) {
  CHORUS_THROW(DeviceError, "cuda:", index, ": this build has no CUDA runtime headers, so its ",
               formatBytes(budget_bytes), " memory budget cannot be enforced");
}

std::optional<CudaMemoryFigures> cudaMemoryFigures(int) { return std::nullopt; }
#endif

}  // namespace chorus::device
