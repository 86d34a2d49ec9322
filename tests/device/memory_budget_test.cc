#include "chorus/device/memory_budget.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <string>

#include "chorus/core/error.h"

namespace chorus::device {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

// Every test installs and must leave the process's default allocator in place for the next.
class MemoryBudgetTest : public ::testing::Test {
 protected:
  void SetUp() override { original_ = c10::GetCPUAllocator(); }
  void TearDown() override { EXPECT_EQ(c10::GetCPUAllocator(), original_); }

  c10::Allocator* original_ = nullptr;
};

at::Tensor floatsOfBytes(std::uint64_t bytes) {
  return at::empty({static_cast<std::int64_t>(bytes / sizeof(float))}, at::kFloat);
}

TEST_F(MemoryBudgetTest, CountsAllocationsAndThrowsRealOutOfMemoryPastBudget) {
  auto budget = MemoryBudget::install(64 * kMiB);
  EXPECT_EQ(c10::GetCPUAllocator(), budget.get());
  EXPECT_EQ(budget->budget(), 64 * kMiB);
  const std::uint64_t base = budget->bytesInUse();
  {
    at::Tensor first = floatsOfBytes(32 * kMiB);
    first.fill_(1.0f);
    EXPECT_EQ(budget->bytesInUse(), base + 32 * kMiB);
    try {
      at::Tensor second = floatsOfBytes(64 * kMiB);
      FAIL() << "a 64 MiB tensor fit in a 64 MiB budget with 32 MiB in use";
    } catch (const c10::OutOfMemoryError& error) {
      const std::string message = error.what_without_backtrace();
      EXPECT_NE(message.find("emulated device budget 64 MiB exceeded"), std::string::npos)
          << message;
      EXPECT_NE(message.find("cannot allocate 64 MiB with 32 MiB in use"), std::string::npos)
          << message;
    }
    // The refused request left no trace.
    EXPECT_EQ(budget->bytesInUse(), base + 32 * kMiB);
    EXPECT_EQ(budget->peakBytes(), base + 32 * kMiB);
    // Memory under a budget is ordinary memory.
    EXPECT_FLOAT_EQ(first.sum().item<float>(), 8.0f * kMiB);
  }
  EXPECT_EQ(budget->bytesInUse(), base);
  // The sum's scalar results briefly joined the 32 MiB tensor at the peak.
  EXPECT_GE(budget->peakBytes(), base + 32 * kMiB);
  EXPECT_LT(budget->peakBytes(), base + 32 * kMiB + 4096);
  budget->resetPeak();
  EXPECT_EQ(budget->peakBytes(), base);
  budget->uninstall();
  EXPECT_FALSE(budget->installed());
}

TEST_F(MemoryBudgetTest, TensorsOutlivingUninstallStillReturnTheirBytes) {
  auto budget = MemoryBudget::install(16 * kMiB);
  at::Tensor survivor = floatsOfBytes(4 * kMiB);
  budget->uninstall();
  EXPECT_EQ(c10::GetCPUAllocator(), original_);
  EXPECT_EQ(budget->bytesInUse(), 4 * kMiB);
  at::Tensor unbudgeted = floatsOfBytes(64 * kMiB);  // the default allocator has no budget
  survivor.reset();
  EXPECT_EQ(budget->bytesInUse(), 0u);
}

TEST_F(MemoryBudgetTest, LastReferenceUninstalls) {
  {
    auto budget = MemoryBudget::install(16 * kMiB);
    EXPECT_EQ(c10::GetCPUAllocator(), budget.get());
  }
  EXPECT_EQ(c10::GetCPUAllocator(), original_);
}

TEST_F(MemoryBudgetTest, RefusesSecondBudgetAndZeroBudget) {
  auto budget = MemoryBudget::install(16 * kMiB);
  EXPECT_THROW(MemoryBudget::install(32 * kMiB), DeviceError);
  EXPECT_EQ(c10::GetCPUAllocator(), budget.get());
  budget->uninstall();
  EXPECT_THROW(MemoryBudget::install(0), ConfigError);
  auto again = MemoryBudget::install(16 * kMiB);  // possible again once uninstalled
  again->uninstall();
}

TEST_F(MemoryBudgetTest, AutogradAndClonesAreCounted) {
  auto budget = MemoryBudget::install(256 * kMiB);
  const std::uint64_t base = budget->bytesInUse();
  {
    at::Tensor weights = at::randn({512, 512}).requires_grad_();
    at::Tensor loss = weights.mm(weights).sum();
    loss.backward();
    EXPECT_GE(budget->peakBytes(), base + 3 * 512 * 512 * sizeof(float));
    at::Tensor copy = weights.detach().clone();
    EXPECT_TRUE(copy.equal(weights.detach()));
  }
  EXPECT_EQ(budget->bytesInUse(), base);
  budget->uninstall();
}

// The CUDA side on any host (tests/gpu covers a real device): an index past the host's GPUs has
// no allocator figures and no cap, on this CPU-only host as on a GPU one.
TEST(CudaMemory, ADeviceThisHostLacksHasNoFiguresAndCannotBeCapped) {
  const int count = static_cast<int>(torch::cuda::device_count());
  EXPECT_FALSE(cudaMemoryFigures(count).has_value());
  EXPECT_FALSE(cudaMemoryFigures(-1).has_value());
  try {
    capCudaMemory(count, 256 * kMiB);
    FAIL() << "cuda:" << count << " was capped";
  } catch (const DeviceError& error) {
    EXPECT_NE(std::string(error.what()).find("cuda:" + std::to_string(count) + ": "),
              std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace chorus::device
