// A CUDA memory budget (`cuda:0/256MiB`) caps libtorch's caching allocator: an allocation past it
// fails as a full device would (label `gpu`; skips without a usable CUDA device).
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "chorus/core/error.h"
#include "chorus/device/discovery.h"
#include "chorus/device/memory_budget.h"

namespace chorus::device {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

TEST(GpuMemoryBudget, AnAllocationPastTheBudgetIsRefused) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no usable CUDA device";
  std::uint64_t total = 0;
  for (const DeviceInfo& device : discoverDevices())
    if (device.kind == DeviceKind::kCuda && device.index == 0) total = device.memory_bytes;
  ASSERT_GT(total, 1024 * kMiB);
  const double fraction = capCudaMemory(0, 256 * kMiB);
  EXPECT_NEAR(fraction, 256.0 * kMiB / static_cast<double>(total), 1e-12);
  const auto cuda = at::TensorOptions().dtype(at::kFloat).device(at::Device("cuda:0"));
  {
    at::Tensor fits = at::empty({static_cast<std::int64_t>(128 * kMiB / 4)}, cuda);
    EXPECT_EQ(fits.nbytes(), 128 * kMiB);
  }
  EXPECT_THROW(at::empty({static_cast<std::int64_t>(512 * kMiB / 4)}, cuda), c10::OutOfMemoryError);
  // The whole device again, for the tests after this one.
  EXPECT_NEAR(capCudaMemory(0, total), 1.0, 1e-12);
  EXPECT_THROW(capCudaMemory(0, total + 1), ConfigError);
}

}  // namespace
}  // namespace chorus::device
