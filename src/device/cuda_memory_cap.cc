// A CUDA device's memory budget (`cuda:1/20GiB`): libtorch's caching allocator capped at a
// fraction of the device's memory. Needs the CUDA runtime headers, as discovery's properties do
// (cuda_discovery.cc); without them a budget on a GPU is refused rather than silently ignored.
#include <c10/util/Exception.h>

#include <cstdint>

#include "chorus/core/error.h"
#include "chorus/core/units.h"
#include "chorus/device/memory_budget.h"

#if __has_include(<cuda_runtime_api.h>)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#define CHORUS_HAVE_CUDA_ALLOCATOR 1
#else
#define CHORUS_HAVE_CUDA_ALLOCATOR 0
#endif

namespace chorus::device {

#if CHORUS_HAVE_CUDA_ALLOCATOR
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
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction,
                                                     static_cast<c10::DeviceIndex>(index));
  return fraction;
}
#else
double capCudaMemory(int index, std::uint64_t budget_bytes) {
  CHORUS_THROW(DeviceError, "cuda:", index, ": this build has no CUDA runtime headers, so its ",
               formatBytes(budget_bytes), " memory budget cannot be enforced");
}
#endif

}  // namespace chorus::device
