#include "chorus/core/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <utility>

#include "chorus/core/error.h"

namespace chorus {
namespace {

struct Unit {
  const char* name;
  double factor;
};

constexpr Unit kUnits[] = {
    {"", 1.0},
    {"B", 1.0},
    {"K", 1024.0},
    {"KiB", 1024.0},
    {"KB", 1e3},
    {"M", 1048576.0},
    {"MiB", 1048576.0},
    {"MB", 1e6},
    {"G", 1073741824.0},
    {"GiB", 1073741824.0},
    {"GB", 1e9},
    {"T", 1099511627776.0},
    {"TiB", 1099511627776.0},
    {"TB", 1e12},
};

[[noreturn]] void badSize(const std::string& text) {
  CHORUS_THROW(ConfigError, "invalid size '", text,
               "': expected a number with an optional unit (B, KiB, MiB, GiB, TiB, K, M, G, T, "
               "KB, MB, GB, TB), e.g. 512MiB");
}

}  // namespace

std::uint64_t parseBytes(const std::string& text) {
  size_t pos = 0;
  while (pos < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[pos])) || text[pos] == '.'))
    ++pos;
  if (pos == 0) badSize(text);
  double number = 0;
  try {
    size_t used = 0;
    number = std::stod(text.substr(0, pos), &used);
    if (used != pos) badSize(text);
  } catch (const std::logic_error&) {
    badSize(text);
  }
  const std::string unit = text.substr(pos);
  for (const Unit& candidate : kUnits) {
    if (unit == candidate.name) {
      const double bytes = std::round(number * candidate.factor);
      if (bytes > 1.8e19) badSize(text);
      return static_cast<std::uint64_t>(bytes);
    }
  }
  badSize(text);
}

std::string formatBytes(std::uint64_t bytes) {
  static const char* const kNames[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  char buffer[32];
  if (unit == 0 || value >= 100.0 || value == std::floor(value))
    std::snprintf(buffer, sizeof buffer, "%.0f %s", value, kNames[unit]);
  else
    std::snprintf(buffer, sizeof buffer, "%.1f %s", value, kNames[unit]);
  return buffer;
}

std::string formatBytesShort(std::uint64_t bytes) {
  static const char* const kNames[] = {"", "K", "M", "G", "T"};
  int unit = 0;
  while (unit < 4 && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++unit;
  }
  return std::to_string(bytes) + kNames[unit];
}

}  // namespace chorus
