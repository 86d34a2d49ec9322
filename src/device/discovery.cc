// The CPU half of device discovery (from /proc), auto expansion and spec validation. The GPU half
// lives in cuda_discovery.cc.
#include "chorus/device/discovery.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>

#include "chorus/core/error.h"
#include "chorus/core/units.h"

namespace chorus::device {
namespace {

std::string readFile(const char* path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  const auto last = text.find_last_not_of(" \t\r\n");
  return text.substr(first, last - first + 1);
}

// The value of the first "key : value" line of /proc/cpuinfo-style text (the first processor's;
// every processor of one socket reports the same model and flags).
std::string firstField(const std::string& text, const std::string& key) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    if (trim(line.substr(0, colon)) == key) return trim(line.substr(colon + 1));
  }
  return "";
}

bool hasWord(const std::string& words, const std::string& word) {
  std::istringstream in(words);
  std::string token;
  while (in >> token)
    if (token == word) return true;
  return false;
}

// A /proc/cpuinfo code and the CPU designer it stands for.
struct DesignerCode {
  const char* code;
  const char* name;
};

constexpr DesignerCode kX86Vendors[] = {{"GenuineIntel", "Intel"},
                                        {"AuthenticAMD", "AMD"},
                                        {"HygonGenuine", "Hygon"},
                                        {"CentaurHauls", "Centaur"}};
// ARM cores have no vendor_id; they name their designer by a JEDEC code instead.
constexpr DesignerCode kArmImplementers[] = {{"0x41", "ARM"},
                                             {"0x61", "Apple"},
                                             {"0xc0", "Ampere"},
                                             {"0x48", "HiSilicon"},
                                             {"0x4e", "NVIDIA"}};

template <std::size_t N>
const char* designerOf(const DesignerCode (&codes)[N], const std::string& code) {
  for (const DesignerCode& known : codes)
    if (code == known.code) return known.name;
  return nullptr;
}

std::string vendorName(const std::string& vendor_id) {
  const char* name = designerOf(kX86Vendors, vendor_id);
  return name ? name : vendor_id;
}

std::string armImplementerName(const std::string& code) {
  if (const char* name = designerOf(kArmImplementers, code)) return name;
  return code.empty() ? "" : "ARM implementer " + code;
}

// Cores this process may run on: the affinity mask, which containers and `taskset` narrow, rather
// than every core of the machine.
int logicalCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return std::max(1u, std::thread::hardware_concurrency());
}

std::uint64_t hostMemoryBytes() {
  const std::string total = firstField(readFile("/proc/meminfo"), "MemTotal");
  if (!total.empty()) {
    try {
      return std::stoull(total) * 1024;  // reported in kB (KiB)
    } catch (const std::exception&) {
      // fall through to sysconf
    }
  }
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page_size);
}

DeviceInfo discoverCpu() {
  DeviceInfo info;
  info.kind = DeviceKind::kCpu;
  info.index = -1;
  detail::parseCpuInfo(readFile("/proc/cpuinfo"), info);
  info.memory_bytes = hostMemoryBytes();
  info.cores = logicalCores();
  return info;
}

std::string describeGpuCount(const std::vector<DeviceInfo>& found) {
  std::vector<int> indices;
  for (const auto& info : found)
    if (info.kind == DeviceKind::kCuda) indices.push_back(info.index);
  if (indices.empty()) return "no CUDA device";
  std::string names;
  for (int index : indices) names += (names.empty() ? "cuda:" : ", cuda:") + std::to_string(index);
  return chorus::detail::concat(
      indices.size(), indices.size() == 1 ? " CUDA device (" : " CUDA devices (", names, ")");
}

const DeviceInfo* findDevice(const DeviceSpec& spec, const std::vector<DeviceInfo>& found) {
  for (const auto& info : found)
    if (info.kind == spec.kind && (spec.kind == DeviceKind::kCpu || info.index == spec.index))
      return &info;
  return nullptr;
}

}  // namespace

bool DeviceInfo::supports(const std::string& dtype) const {
  return std::find(dtypes.begin(), dtypes.end(), dtype) != dtypes.end();
}

namespace detail {

void parseCpuInfo(const std::string& cpuinfo, DeviceInfo& info) {
  info.name = firstField(cpuinfo, "model name");
  info.vendor = vendorName(firstField(cpuinfo, "vendor_id"));
  if (info.vendor.empty()) info.vendor = armImplementerName(firstField(cpuinfo, "CPU implementer"));
  if (info.vendor.empty()) info.vendor = "unknown";
  if (info.name.empty()) info.name = info.vendor == "unknown" ? "CPU" : info.vendor + " CPU";
  // x86 calls its feature list "flags", ARM "Features".
  std::string flags = firstField(cpuinfo, "flags");
  if (flags.empty()) flags = firstField(cpuinfo, "Features");
  info.dtypes = {"fp32"};
  if (hasWord(flags, "avx512_bf16") || hasWord(flags, "amx_bf16") || hasWord(flags, "bf16"))
    info.dtypes.push_back("bf16");
}

}  // namespace detail

std::vector<DeviceInfo> discoverDevices() {
  std::vector<DeviceInfo> found{discoverCpu()};
  for (auto& gpu : detail::discoverCudaDevices()) found.push_back(std::move(gpu));
  return found;
}

std::vector<DeviceSpec> expandAuto(const std::vector<DeviceSpec>& specs,
                                   const std::vector<DeviceInfo>& found) {
  std::vector<DeviceSpec> out;
  for (const auto& spec : specs) {
    if (spec.kind != DeviceKind::kAuto) {
      out.push_back(spec);
      continue;
    }
    int cpu_cores = 1;
    std::size_t gpus = 0;
    for (const auto& info : found) {
      if (info.kind == DeviceKind::kCpu) cpu_cores = std::max(1, info.cores);
      if (info.kind != DeviceKind::kCuda) continue;
      DeviceSpec gpu;
      gpu.kind = DeviceKind::kCuda;
      gpu.index = info.index;
      out.push_back(gpu);
      ++gpus;
    }
    if (gpus > 0) continue;
    for (int i = 0; i < std::min(cpu_cores, kMaxAutoCpuWorkers); ++i) out.push_back(DeviceSpec{});
  }
  return out;
}

void validateSpecs(const std::vector<DeviceSpec>& specs, const std::vector<DeviceInfo>& found) {
  for (const auto& spec : expandAuto(specs, found)) {
    const DeviceInfo* device = findDevice(spec, found);
    if (device == nullptr) {
      if (spec.kind == DeviceKind::kCuda)
        CHORUS_THROW(ConfigError, "device spec '", spec.toString(), "': this host has ",
                     describeGpuCount(found));
      continue;  // the CPU always exists even if a caller's list leaves it out
    }
    if (spec.memory_budget && device->memory_bytes > 0 &&
        *spec.memory_budget > device->memory_bytes)
      CHORUS_THROW(ConfigError, "device spec '", spec.toString(), "': memory budget ",
                   formatBytes(*spec.memory_budget), " exceeds the ",
                   formatBytes(device->memory_bytes), " of ", device->name);
  }
}

std::string describe(const DeviceInfo& info) {
  std::string where = info.kind == DeviceKind::kCuda ? "cuda:" + std::to_string(info.index) : "cpu";
  std::string details = info.vendor + ", " + formatBytes(info.memory_bytes);
  if (!info.compute_capability.empty()) details += ", cc " + info.compute_capability;
  if (info.kind == DeviceKind::kCpu) details += ", " + std::to_string(info.cores) + " cores";
  return where + " " + info.name + " (" + details + ")";
}

}  // namespace chorus::device
