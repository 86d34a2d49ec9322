// A GPU's figures in the metrics (label `gpu`; each test skips without a usable CUDA device): a
// node monitor reads the node's GPUs through the driver's NVML and serves them as `chorus_gpu_*`
// series, among them the GPU behind cuda:0 (by PCI address) with its memory; the caching
// allocator's figures a GPU rank reports as its memory follow a tensor's allocation exactly.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cstdint>
#include <regex>
#include <string>

#include "chorus/device/discovery.h"
#include "chorus/device/memory_budget.h"
#include "chorus/observe/node_monitor.h"
#include "observe/http_get.h"

namespace chorus {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

// The value of `name{labels}` where the labels are exactly `labels`, or -1.
double sample(const std::string& text, const std::string& name, const std::string& labels) {
  const std::string head = "\n" + name + "{" + labels + "} ";
  const size_t at = text.find(head);
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + head.size(), text.find('\n', at + 1) - at - head.size()));
}

TEST(GpuMetrics, TheNodeMonitorServesTheGpuBehindCuda0ThroughNvml) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no usable CUDA device";
  std::uint64_t cuda_total = 0;
  for (const device::DeviceInfo& found : device::discoverDevices())
    if (found.kind == DeviceKind::kCuda && found.index == 0) cuda_total = found.memory_bytes;
  ASSERT_GT(cuda_total, 0u);
  // NVML counts every process's memory; this one's 256 MiB is in it at the scrape.
  const at::Tensor held = at::empty({static_cast<std::int64_t>(256 * kMiB / 4)},
                                    at::TensorOptions().dtype(at::kFloat).device("cuda:0"));
  observe::NodeMonitorOptions options;
  options.address = "127.0.0.1";
  options.node = 0;
  observe::NodeMonitor monitor(options);
  const auto scraped = testing::httpGet(monitor.port(), "/metrics");
  ASSERT_EQ(scraped.status, 200);
  const std::string& text = scraped.body;
  // cuda:0 is one of NVML's GPUs whatever CUDA_VISIBLE_DEVICES made of the order: find its index.
  const std::string pci = device::physicalGpuId(0);
  const std::regex info("\nchorus_gpu_info\\{gpu=\"(\\d+)\",name=\"([^\"]*)\",node=\"0\",pci=\"" +
                        pci + "\"\\} 1\n");
  std::smatch found;
  ASSERT_TRUE(std::regex_search(text, found, info)) << pci << " not among\n" << text;
  EXPECT_FALSE(found[2].str().empty());
  const std::string labels = "gpu=\"" + found[1].str() + "\",node=\"0\"";
  // The same GPU as CUDA's: NVML's total and CUDA's differ only by what the driver keeps back.
  EXPECT_NEAR(sample(text, "chorus_gpu_memory_total_bytes", labels),
              static_cast<double>(cuda_total), 0.05 * static_cast<double>(cuda_total))
      << text;
  EXPECT_GE(sample(text, "chorus_gpu_memory_used_bytes", labels), 256.0 * kMiB) << text;
  const double utilization = sample(text, "chorus_gpu_utilization_ratio", labels);
  EXPECT_GE(utilization, 0.0) << text;
  EXPECT_LE(utilization, 1.0);
  // Power is optional in NVML; a data-centre GPU reports it, and it is never 0 while powered.
  const double watts = sample(text, "chorus_gpu_power_watts", labels);
  if (watts != -1) EXPECT_GT(watts, 0.0);
  EXPECT_EQ(held.device().type(), at::kCUDA);
}

TEST(GpuMetrics, TheCachingAllocatorsFiguresFollowATensor) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no usable CUDA device";
  const auto cuda = at::TensorOptions().dtype(at::kFloat).device("cuda:0");
  at::empty({1}, cuda);  // CUDA initialized, the allocator set up
  const auto before = device::cudaMemoryFigures(0);
  ASSERT_TRUE(before.has_value());
  std::uint64_t peak = 0;
  {
    const at::Tensor tensor = at::empty({static_cast<std::int64_t>(64 * kMiB / 4)}, cuda);
    const auto during = device::cudaMemoryFigures(0);
    ASSERT_TRUE(during.has_value());
    // 64 MiB is a multiple of the allocator's 512-byte rounding: exactly that much more.
    EXPECT_EQ(during->allocated - before->allocated, 64 * kMiB);
    EXPECT_GE(during->reserved, during->allocated);
    EXPECT_GE(during->allocated_peak, during->allocated);
    peak = during->allocated_peak;
  }
  const auto after = device::cudaMemoryFigures(0);
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(after->allocated, before->allocated);  // freed to the cache, not to the device
  EXPECT_GE(after->reserved, 64 * kMiB);
  EXPECT_EQ(after->allocated_peak, peak);
  const int count = static_cast<int>(torch::cuda::device_count());
  EXPECT_FALSE(device::cudaMemoryFigures(count).has_value());  // no such device
  EXPECT_FALSE(device::cudaMemoryFigures(-1).has_value());
}

}  // namespace
}  // namespace chorus
