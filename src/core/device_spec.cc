#include "chorus/core/device_spec.h"

#include <cctype>
#include <charconv>
#include <sstream>

#include "chorus/core/error.h"
#include "chorus/core/name_table.h"
#include "chorus/core/units.h"

namespace chorus {
namespace {

constexpr const char* kExpected =
    "expected 'auto', 'cpu' or 'cuda:N', optionally followed by '@SPEED' (0.001 <= SPEED <= 1) and "
    "'/MEMORY' (e.g. cpu@0.5/512MiB, cuda:1/20GiB)";

[[noreturn]] void badSpec(const std::string& text, const std::string& why) {
  CHORUS_THROW(ConfigError, "invalid device spec '", text, "': ", why, "; ", kExpected);
}

std::string trim(const std::string& text) {
  size_t begin = 0, end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  return text.substr(begin, end - begin);
}

bool allDigits(const std::string& text) {
  if (text.empty()) return false;
  for (char c : text)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

void parseDevice(const std::string& text, const std::string& device, DeviceSpec& spec) {
  if (device == "auto") {
    spec.kind = DeviceKind::kAuto;
  } else if (device == "cpu") {
    spec.kind = DeviceKind::kCpu;
  } else if (device.rfind("cuda:", 0) == 0) {
    const std::string index = device.substr(5);
    if (!allDigits(index) || index.size() > 4) badSpec(text, "the CUDA index must be a number");
    spec.kind = DeviceKind::kCuda;
    spec.index = std::stoi(index);
  } else if (device == "cuda") {
    badSpec(text, "a CUDA device needs an index");
  } else {
    badSpec(text, "unknown device '" + device + "'");
  }
}

double parseSpeed(const std::string& text, const std::string& speed) {
  double value = 0;
  size_t used = 0;
  try {
    value = std::stod(speed, &used);
  } catch (const std::logic_error&) {
    used = 0;
  }
  if (used == 0 || used != speed.size() || !(value >= kMinEmulatedSpeed && value <= 1.0))
    badSpec(text, "the speed '" + speed + "' must be a number in [0.001, 1]");
  return value;
}

constexpr NamedValue<DeviceKind> kDeviceKindNames[] = {
    {DeviceKind::kAuto, "auto"}, {DeviceKind::kCpu, "cpu"}, {DeviceKind::kCuda, "cuda"}};

}  // namespace

const char* toString(DeviceKind kind) { return nameOf(kDeviceKindNames, kind); }

DeviceSpec parseDeviceSpec(const std::string& raw) {
  const std::string text = trim(raw);
  if (text.empty()) badSpec(raw, "the spec is empty");
  DeviceSpec spec;
  const size_t slash = text.find('/');
  const std::string head = text.substr(0, slash);
  if (slash != std::string::npos) {
    const std::string memory = text.substr(slash + 1);
    try {
      spec.memory_budget = parseBytes(memory);
    } catch (const ConfigError&) {
      badSpec(text, "the memory budget '" + memory + "' is not a size");
    }
    if (*spec.memory_budget == 0) badSpec(text, "the memory budget must be positive");
  }
  const size_t at = head.find('@');
  parseDevice(text, head.substr(0, at), spec);
  if (at != std::string::npos) spec.speed = parseSpeed(text, head.substr(at + 1));
  if (spec.kind == DeviceKind::kAuto && spec.emulated())
    badSpec(text, "'auto' takes no speed or memory budget");
  return spec;
}

std::vector<DeviceSpec> parseDeviceSpecs(const std::string& text) {
  std::vector<DeviceSpec> specs;
  std::vector<std::string> items;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) items.push_back(item);
  if (!text.empty() && text.back() == ',') items.emplace_back();
  for (const std::string& one : items) {
    try {
      specs.push_back(parseDeviceSpec(one));
    } catch (const ConfigError& error) {
      if (items.size() == 1) throw;
      CHORUS_THROW(ConfigError, "in device list '", text, "': ", error.message());
    }
  }
  if (specs.empty()) CHORUS_THROW(ConfigError, "empty device list; ", kExpected);
  for (const DeviceSpec& spec : specs)
    if (spec.kind == DeviceKind::kAuto && specs.size() > 1)
      CHORUS_THROW(ConfigError, "invalid device list '", text, "': 'auto' must stand alone");
  return specs;
}

std::string DeviceSpec::toString() const {
  std::ostringstream out;
  out << chorus::toString(kind);
  if (kind == DeviceKind::kCuda) out << ':' << index;
  if (speed != 1.0) {
    // Shortest text that reads back to the same double.
    char buffer[32];
    const auto result = std::to_chars(buffer, buffer + sizeof buffer, speed);
    out << '@' << std::string(buffer, result.ptr);
  }
  if (memory_budget) {
    std::string size = formatBytesShort(*memory_budget);
    // formatBytesShort gives "512M"; the spec grammar reads that back as MiB.
    out << '/' << size;
  }
  return out.str();
}

bool DeviceSpec::operator==(const DeviceSpec& other) const {
  return kind == other.kind && index == other.index && speed == other.speed &&
         memory_budget == other.memory_budget;
}

std::string toString(const std::vector<DeviceSpec>& specs) {
  std::string text;
  for (size_t i = 0; i < specs.size(); ++i) text += (i ? "," : "") + specs[i].toString();
  return text;
}

}  // namespace chorus
