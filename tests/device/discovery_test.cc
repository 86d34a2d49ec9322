#include "chorus/device/discovery.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "chorus/core/error.h"

namespace chorus::device {
namespace {

DeviceInfo fakeCpu(int cores) {
  DeviceInfo cpu;
  cpu.name = "Fake CPU";
  cpu.kind = DeviceKind::kCpu;
  cpu.vendor = "Intel";
  cpu.memory_bytes = 16ull << 30;
  cpu.dtypes = {"fp32"};
  cpu.cores = cores;
  return cpu;
}

DeviceInfo fakeGpu(int index) {
  DeviceInfo gpu;
  gpu.name = "Fake GPU";
  gpu.kind = DeviceKind::kCuda;
  gpu.index = index;
  gpu.vendor = "NVIDIA";
  gpu.memory_bytes = 80ull << 30;
  gpu.compute_capability = "9.0";
  gpu.dtypes = {"fp32", "tf32", "bf16", "fp16"};
  gpu.cores = 132;
  return gpu;
}

std::string configErrorOf(const std::string& specs, const std::vector<DeviceInfo>& found) {
  try {
    validateSpecs(parseDeviceSpecs(specs), found);
  } catch (const ConfigError& error) {
    return error.message();
  }
  return "";
}

TEST(DiscoveryTest, FindsExactlyOneCpuFirstWithCoresAndMemory) {
  const auto found = discoverDevices();
  ASSERT_FALSE(found.empty());
  const auto cpus = std::count_if(found.begin(), found.end(),
                                  [](const DeviceInfo& d) { return d.kind == DeviceKind::kCpu; });
  EXPECT_EQ(cpus, 1);
  const DeviceInfo& cpu = found.front();
  EXPECT_EQ(cpu.kind, DeviceKind::kCpu);
  EXPECT_GT(cpu.cores, 0);
  EXPECT_GT(cpu.memory_bytes, 64ull << 20);
  EXPECT_FALSE(cpu.name.empty());
  EXPECT_FALSE(cpu.vendor.empty());
  EXPECT_TRUE(cpu.supports("fp32"));
  EXPECT_EQ(cpu.compute_capability, "");
}

TEST(DiscoveryTest, GpusAreNumberedInOrderWithProperties) {
  const auto found = discoverDevices();
  int expected = 0;
  for (const auto& info : found) {
    if (info.kind != DeviceKind::kCuda) continue;
    EXPECT_EQ(info.index, expected++);
    EXPECT_TRUE(info.vendor == "NVIDIA" || info.vendor == "AMD") << info.vendor;
    EXPECT_GT(info.memory_bytes, 0u);
    EXPECT_TRUE(info.supports("fp32"));
  }
  if (expected == 0) GTEST_SKIP() << "no GPU on this host";
}

TEST(DiscoveryTest, ParsesCpuInfoVendorAndNativeBf16) {
  DeviceInfo info;
  detail::parseCpuInfo(
      "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
      "flags\t\t: fpu avx512f amx_bf16 amx_tile\n",
      info);
  EXPECT_EQ(info.vendor, "Intel");
  EXPECT_EQ(info.name, "Intel(R) Xeon(R) Platinum 8480+");
  EXPECT_EQ(info.dtypes, (std::vector<std::string>{"fp32", "bf16"}));

  DeviceInfo plain;
  detail::parseCpuInfo("vendor_id : AuthenticAMD\nmodel name : AMD EPYC\nflags : avx2 avx512f\n",
                       plain);
  EXPECT_EQ(plain.vendor, "AMD");
  EXPECT_EQ(plain.dtypes, (std::vector<std::string>{"fp32"}));  // no avx512_bf16: bf16 is emulated
}

TEST(DiscoveryTest, AutoOnCpuOnlyHostGivesOneWorkerPerCoreUpToFour) {
  const auto two = expandAuto(parseDeviceSpecs("auto"), {fakeCpu(2)});
  ASSERT_EQ(two.size(), 2u);
  for (const auto& spec : two) {
    EXPECT_EQ(spec.kind, DeviceKind::kCpu);
    EXPECT_FALSE(spec.emulated());
  }
  EXPECT_EQ(expandAuto(parseDeviceSpecs("auto"), {fakeCpu(64)}).size(), 4u);
  EXPECT_EQ(expandAuto(parseDeviceSpecs("auto"), {fakeCpu(1)}).size(), 1u);
}

TEST(DiscoveryTest, AutoOnThisHostGivesGpusOrCpuWorkers) {
  const auto found = discoverDevices();
  const auto specs = expandAuto(parseDeviceSpecs("auto"), found);
  ASSERT_FALSE(specs.empty());
  const bool has_gpu = found.size() > 1;
  for (const auto& spec : specs)
    EXPECT_EQ(spec.kind, has_gpu ? DeviceKind::kCuda : DeviceKind::kCpu);
  EXPECT_NO_THROW(validateSpecs(specs, found));
}

TEST(DiscoveryTest, AutoWithTwoGpusGivesCuda0AndCuda1) {
  const auto specs = expandAuto(parseDeviceSpecs("auto"), {fakeCpu(8), fakeGpu(0), fakeGpu(1)});
  EXPECT_EQ(toString(specs), "cuda:0,cuda:1");
}

TEST(DiscoveryTest, ExplicitSpecsPassThroughUnchanged) {
  const auto specs = parseDeviceSpecs("cpu@0.5/512MiB,cuda:1");
  EXPECT_EQ(expandAuto(specs, {fakeCpu(8), fakeGpu(0), fakeGpu(1)}), specs);
}

TEST(DiscoveryTest, RejectsMissingGpuNamingSpecAndWhatExists) {
  EXPECT_EQ(configErrorOf("cuda:3", {fakeCpu(2), fakeGpu(0)}),
            "device spec 'cuda:3': this host has 1 CUDA device (cuda:0)");
  EXPECT_EQ(configErrorOf("cpu,cuda:2", {fakeCpu(2), fakeGpu(0), fakeGpu(1)}),
            "device spec 'cuda:2': this host has 2 CUDA devices (cuda:0, cuda:1)");
  EXPECT_EQ(configErrorOf("cuda:0", {fakeCpu(2)}),
            "device spec 'cuda:0': this host has no CUDA device");
}

TEST(DiscoveryTest, RejectsBudgetLargerThanDevice) {
  const std::string message = configErrorOf("cuda:0/100GiB", {fakeCpu(2), fakeGpu(0)});
  EXPECT_NE(message.find("'cuda:0/100G'"), std::string::npos) << message;
  EXPECT_NE(message.find("80 GiB"), std::string::npos) << message;
  EXPECT_NE(configErrorOf("cpu/32GiB", {fakeCpu(2)}), "");
  EXPECT_EQ(configErrorOf("cpu@0.5/512MiB,cuda:0/20GiB", {fakeCpu(2), fakeGpu(0)}), "");
}

TEST(DiscoveryTest, DescribeNamesDeviceAndMemory) {
  EXPECT_EQ(describe(fakeGpu(1)), "cuda:1 Fake GPU (NVIDIA, 80 GiB, cc 9.0)");
  EXPECT_EQ(describe(fakeCpu(2)), "cpu Fake CPU (Intel, 16 GiB, 2 cores)");
}

}  // namespace
}  // namespace chorus::device
