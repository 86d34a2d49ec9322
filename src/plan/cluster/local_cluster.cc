#include "chorus/plan/local_cluster.h"

#include <iomanip>
#include <sstream>

#include "chorus/core/error.h"
#include "chorus/core/units.h"

namespace chorus::plan {
namespace {

constexpr double kGiga = 1e9;
constexpr const char* kDtypeKeys[kDtypeCount] = {"fp32_tflops", "tf32_tflops", "bf16_tflops",
                                                 "fp16_tflops"};

// Six significant digits: enough for measured figures, and exact enough that the file parses back
// to the same cluster up to that precision.
std::string number(double value) {
  std::ostringstream text;
  text << std::setprecision(6) << value;
  return text.str();
}

// A TOML basic string (names are device specs; only quotes and backslashes need escaping).
std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// "64G" when that is exact, else the byte count, so the file parses back to the same memory.
std::string memoryText(std::uint64_t bytes) {
  const std::string short_form = formatBytesShort(bytes);
  return parseBytes(short_form) == bytes ? short_form : std::to_string(bytes);
}

bool sameFigures(const MeasuredDevice& a, const MeasuredDevice& b) {
  for (int d = 0; d < kDtypeCount; ++d)
    if (a.gflops[d] != b.gflops[d]) return false;
  return a.memory_bytes == b.memory_bytes && a.memory_bandwidth_gbs == b.memory_bandwidth_gbs &&
         a.device_class == b.device_class && a.vendor == b.vendor &&
         a.core_fraction == b.core_fraction;
}

void writeType(std::ostringstream& out, const MeasuredDevice& device) {
  measuredDeviceType(device);  // validates
  out << "\n[[device_type]]\n";
  if (!device.description.empty()) out << "# measured: " << device.description << "\n";
  out << "name = " << quoted(device.name) << "\n"
      << "class = " << (device.device_class == DeviceClass::kCpu ? "\"cpu\"" : "\"gpu\"") << "\n"
      << "vendor = " << quoted(device.vendor) << "\n"
      << "memory = " << quoted(memoryText(device.memory_bytes)) << "\n"
      << "memory_bandwidth_gbs = " << number(device.memory_bandwidth_gbs) << "\n";
  for (int d = 0; d < kDtypeCount; ++d)
    if (device.gflops[d] > 0)
      out << kDtypeKeys[d] << " = " << number(device.gflops[d] / 1e3) << "\n";
  out << "efficiency = 1  # the figures are achieved matmul rates, not datasheet peaks\n";
  if (device.core_fraction != 1)
    out << "core_fraction = " << number(device.core_fraction)
        << "  # of a host core: the emulator sleeps the rest\n";
}

void writeLink(std::ostringstream& out, const LinkType& link) {
  out << "\n[[link_type]]\n"
      << "name = " << quoted(link.name) << "\n"
      << "bandwidth_gbs = " << number(link.bandwidth / kGiga) << "\n"
      << "efficiency = " << number(link.efficiency) << "\n"
      << "latency_us = " << number(link.latency * 1e6) << "\n";
}

// True when `link` is the catalog's entry of its name, figure for figure.
bool inCatalog(const LinkType& link) {
  const LinkType* known = findLinkType(link.name);
  return known && known->name == link.name && known->bandwidth == link.bandwidth &&
         known->efficiency == link.efficiency && known->latency == link.latency;
}

}  // namespace

MeasuredDevice emulateDevice(const MeasuredDevice& device, const std::string& name, double speed,
                             std::uint64_t memory_budget) {
  CHORUS_CHECK_CONFIG(speed > 0 && speed <= 1, "device '", name,
                      "': emulated speed must be in (0, 1], got ", speed);
  CHORUS_CHECK_CONFIG(memory_budget <= device.memory_bytes, "device '", name, "': memory budget ",
                      formatBytes(memory_budget), " exceeds the device's ",
                      formatBytes(device.memory_bytes));
  MeasuredDevice emulated = device;
  emulated.name = name;
  for (double& rate : emulated.gflops) rate *= speed;
  emulated.core_fraction *= speed;
  if (memory_budget > 0) emulated.memory_bytes = memory_budget;
  return emulated;
}

DeviceType measuredDeviceType(const MeasuredDevice& device) {
  CHORUS_CHECK_CONFIG(!device.name.empty(), "a measured device needs a name");
  CHORUS_CHECK_CONFIG(device.gflops[static_cast<int>(Dtype::kFp32)] > 0 &&
                          device.memory_bandwidth_gbs > 0 && device.memory_bytes > 0,
                      "measured device '", device.name,
                      "': fp32 GFLOP/s, memory bandwidth and memory must be > 0");
  DeviceType type;
  type.name = device.name;
  type.vendor = device.vendor;
  type.device_class = device.device_class;
  type.memory_bytes = device.memory_bytes;
  type.memory_bandwidth = device.memory_bandwidth_gbs * kGiga;
  for (int d = 0; d < kDtypeCount; ++d) type.peak_flops[d] = device.gflops[d] * kGiga;
  type.efficiency = 1;
  CHORUS_CHECK_CONFIG(device.core_fraction > 0 && device.core_fraction <= 1, "measured device '",
                      device.name, "': core fraction must be in (0, 1]");
  type.core_fraction = device.core_fraction;
  return type;
}

LinkType measuredShmLink(double memory_bandwidth_gbs) {
  CHORUS_CHECK_CONFIG(memory_bandwidth_gbs > 0, "memory bandwidth must be > 0");
  LinkType link = *findLinkType("shm");
  link.name = "shm-measured";
  link.bandwidth = memory_bandwidth_gbs / 4 * kGiga;
  return link;
}

// The distinct types of `cluster`'s devices, in order of first appearance; equal names must have
// equal figures.
std::vector<const MeasuredDevice*> distinctTypes(const LocalCluster& cluster) {
  CHORUS_CHECK_CONFIG(!cluster.devices.empty(), "a local cluster needs at least one device");
  std::vector<const MeasuredDevice*> types;
  for (const auto& device : cluster.devices) {
    bool known = false;
    for (const MeasuredDevice* type : types) {
      if (type->name != device.name) continue;
      CHORUS_CHECK_CONFIG(sameFigures(*type, device), "two measured devices are named '",
                          device.name, "' but differ");
      known = true;
    }
    if (!known) types.push_back(&device);
  }
  return types;
}

// Calls `run(first, count)` for each run of devices of one type, in rank order.
template <typename Run>
void forEachRun(const LocalCluster& cluster, Run run) {
  for (size_t i = 0; i < cluster.devices.size();) {
    size_t end = i + 1;
    while (end < cluster.devices.size() && cluster.devices[end].name == cluster.devices[i].name)
      ++end;
    run(cluster.devices[i], static_cast<int>(end - i));
    i = end;
  }
}

std::string localClusterToml(const LocalCluster& cluster) {
  const std::vector<const MeasuredDevice*> types = distinctTypes(cluster);
  std::ostringstream out;
  for (const auto& line : cluster.comments) out << "# " << line << "\n";
  out << "name = " << quoted(cluster.name) << "\n";
  for (const MeasuredDevice* type : types) writeType(out, *type);
  if (!inCatalog(cluster.intra_link)) writeLink(out, cluster.intra_link);
  out << "\n[[node]]\nname = " << quoted(cluster.node) << "\n"
      << "intra_node_link = " << quoted(cluster.intra_link.name) << "\n";
  CHORUS_CHECK_CONFIG(cluster.core_contention >= 0, "core contention must be >= 0");
  if (cluster.core_contention > 0)
    out << "core_contention = " << number(cluster.core_contention)
        << "  # measured: CPU workers sharing cores slow each other\n";
  out << "devices = [";
  // Runs of one type become one entry with a count, in rank order.
  bool first = true;
  forEachRun(cluster, [&](const MeasuredDevice& device, int count) {
    out << (first ? "" : ", ") << "{ type = " << quoted(device.name) << ", count = " << count
        << " }";
    first = false;
  });
  out << "]\n";
  return out.str();
}

Cluster toCluster(const LocalCluster& local) {
  distinctTypes(local);  // validates
  CHORUS_CHECK_CONFIG(local.core_contention >= 0, "core contention must be >= 0");
  Cluster cluster(local.name);
  // One node: the inter-node link is never crossed; the cluster file's default stands in.
  const int node = cluster.addNode(local.node, local.intra_link, *findLinkType("eth-10g"), 1,
                                   local.core_contention);
  forEachRun(local, [&](const MeasuredDevice& device, int count) {
    cluster.addDevices(node, measuredDeviceType(device), count);
  });
  return cluster;
}

}  // namespace chorus::plan
