// The node's GPU series: readings become `chorus_gpu_*` lines with exact names, labels and
// values, a GPU or figure no longer read leaves the exposition, the node monitor reads its source
// at each scrape, and NVML's loader reports its absence (no library, a library without NVML's
// entry points) as a reason, never an error. The readings come through GpuSource, the seam the
// agent reads NVML through; tests/gpu/gpu_metrics_test.cc checks NVML itself on a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "chorus/observe/gpu_readings.h"
#include "chorus/observe/node_metrics.h"
#include "chorus/observe/node_monitor.h"
#include "http_get.h"

namespace chorus::observe {
namespace {

using chorus::testing::httpGet;

GpuReading h200(int index, const std::string& pci) {
  GpuReading gpu;
  gpu.index = index;
  gpu.name = "NVIDIA H200";
  gpu.pci = pci;
  gpu.utilization = 0.87;
  gpu.memory_used_bytes = 80000000000ull;
  gpu.memory_total_bytes = 150754820096ull;
  gpu.power_watts = 412.5;
  return gpu;
}

// The exposition's lines that start with `prefix`, sorted (prometheus-cpp orders a family's
// series by a hash of their labels).
std::vector<std::string> linesOf(const std::string& text, const std::string& prefix) {
  std::vector<std::string> found;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    if (line.rfind(prefix, 0) == 0) found.push_back(line);
    start = end + 1;
  }
  std::sort(found.begin(), found.end());
  return found;
}

TEST(NodeMetrics, GpuReadingsBecomeGpuSeriesPerNodeAndIndex) {
  NodeMetrics metrics(2);
  GpuReading second = h200(1, "pci:0000:9a:00");
  second.utilization = 0.0;
  second.memory_used_bytes = 0;
  second.power_watts.reset();  // a board that does not report its power
  metrics.updateGpus({h200(0, "pci:0000:1b:00"), second});
  const std::string text = metrics.exposition();
  EXPECT_EQ(
      linesOf(text, "chorus_gpu_info"),
      (std::vector<std::string>{
          "chorus_gpu_info{gpu=\"0\",name=\"NVIDIA H200\",node=\"2\",pci=\"pci:0000:1b:00\"} 1",
          "chorus_gpu_info{gpu=\"1\",name=\"NVIDIA H200\",node=\"2\",pci=\"pci:0000:9a:00\"} "
          "1"}));
  EXPECT_EQ(linesOf(text, "chorus_gpu_utilization_ratio"),
            (std::vector<std::string>{"chorus_gpu_utilization_ratio{gpu=\"0\",node=\"2\"} 0.87",
                                      "chorus_gpu_utilization_ratio{gpu=\"1\",node=\"2\"} 0"}));
  EXPECT_EQ(
      linesOf(text, "chorus_gpu_memory_used_bytes"),
      (std::vector<std::string>{"chorus_gpu_memory_used_bytes{gpu=\"0\",node=\"2\"} 80000000000",
                                "chorus_gpu_memory_used_bytes{gpu=\"1\",node=\"2\"} 0"}));
  EXPECT_EQ(linesOf(text, "chorus_gpu_memory_total_bytes"),
            (std::vector<std::string>{
                "chorus_gpu_memory_total_bytes{gpu=\"0\",node=\"2\"} 150754820096",
                "chorus_gpu_memory_total_bytes{gpu=\"1\",node=\"2\"} 150754820096"}));
  EXPECT_EQ(linesOf(text, "chorus_gpu_power_watts"),
            (std::vector<std::string>{"chorus_gpu_power_watts{gpu=\"0\",node=\"2\"} 412.5"}));
  for (const char* type :
       {"# TYPE chorus_gpu_info gauge", "# TYPE chorus_gpu_utilization_ratio gauge",
        "# TYPE chorus_gpu_memory_used_bytes gauge", "# TYPE chorus_gpu_memory_total_bytes gauge",
        "# TYPE chorus_gpu_power_watts gauge"})
    EXPECT_EQ(linesOf(text, type).size(), 1u) << type << " not in\n" << text;
}

TEST(NodeMetrics, AGpuOrFigureNoLongerReadLeavesTheExposition) {
  NodeMetrics metrics(0);
  metrics.updateGpus({h200(0, "pci:0000:1b:00"), h200(1, "pci:0000:9a:00")});
  GpuReading only = h200(0, "pci:0000:1b:00");
  only.power_watts.reset();
  only.utilization = 0.5;
  metrics.updateGpus({only});
  const std::string text = metrics.exposition();
  EXPECT_EQ(text.find("gpu=\"1\""), std::string::npos) << text;
  EXPECT_TRUE(linesOf(text, "chorus_gpu_power_watts{").empty()) << text;
  EXPECT_EQ(linesOf(text, "chorus_gpu_utilization_ratio"),
            (std::vector<std::string>{"chorus_gpu_utilization_ratio{gpu=\"0\",node=\"0\"} 0.5"}));
  metrics.updateGpus({});
  EXPECT_EQ(metrics.exposition().find("gpu=\""), std::string::npos) << metrics.exposition();
}

// A node with one GPU whose utilization is the number of reads so far / 100.
class CountingSource final : public GpuSource {
 public:
  std::vector<GpuReading> read() override {
    GpuReading gpu = h200(0, "pci:0000:1b:00");
    gpu.utilization = ++reads / 100.0;
    return {gpu};
  }
  std::atomic<int> reads{0};
};

TEST(NodeMonitor, EachScrapeReadsTheNodesGpus) {
  auto source = std::make_shared<CountingSource>();
  NodeMonitorOptions options;
  options.address = "127.0.0.1";
  options.node = 4;
  options.gpus = source;
  NodeMonitor monitor(options);
  EXPECT_EQ(source->reads, 0);  // nothing read before a scrape
  const auto first = httpGet(monitor.port(), "/metrics");
  ASSERT_EQ(first.status, 200);
  EXPECT_EQ(linesOf(first.body, "chorus_gpu_utilization_ratio"),
            (std::vector<std::string>{"chorus_gpu_utilization_ratio{gpu=\"0\",node=\"4\"} 0.01"}));
  const auto second = httpGet(monitor.port(), "/metrics");
  EXPECT_EQ(linesOf(second.body, "chorus_gpu_utilization_ratio"),
            (std::vector<std::string>{"chorus_gpu_utilization_ratio{gpu=\"0\",node=\"4\"} 0.02"}));
  EXPECT_EQ(source->reads, 2);
}

TEST(Nvml, AMissingLibraryIsAReasonNotAnError) {
  const NvmlOpening opening = openNvml("libchorus-no-such-nvml.so.1");
  EXPECT_EQ(opening.source, nullptr);
  EXPECT_NE(opening.absent.find("libchorus-no-such-nvml.so.1"), std::string::npos)
      << opening.absent;
}

TEST(Nvml, ALibraryWithoutNvmlsEntryPointsIsAReasonNotAnError) {
  const NvmlOpening opening = openNvml("libc.so.6");
  EXPECT_EQ(opening.source, nullptr);
  EXPECT_EQ(opening.absent, "libc.so.6 has no nvmlInit_v2");
}

TEST(Nvml, TheDriversLibraryReadsGpusOrSaysWhyNot) {
  // Either outcome is a node chorus runs on: a GPU host reads at least one GPU with its memory,
  // any other host (this CI's) gets a reason.
  const NvmlOpening opening = openNvml();
  if (opening.source == nullptr) {
    EXPECT_FALSE(opening.absent.empty());
    return;
  }
  EXPECT_TRUE(opening.absent.empty()) << opening.absent;
  const std::vector<GpuReading> gpus = opening.source->read();
  ASSERT_FALSE(gpus.empty());
  EXPECT_GT(gpus[0].memory_total_bytes.value_or(0), 0u);
}

}  // namespace
}  // namespace chorus::observe
