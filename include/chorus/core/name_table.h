// Enum <-> name tables: one list of {value, name} pairs serves toString, the parser and the list
// of known names in its error message, so the three cannot drift apart.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "chorus/core/error.h"

namespace chorus {

template <typename Enum>
struct NamedValue {
  Enum value;
  const char* name;
};

// The name of `value` in `table`; "?" for a value the table lacks (a cast out of range).
template <typename Enum, std::size_t N>
const char* nameOf(const NamedValue<Enum> (&table)[N], Enum value) {
  for (const NamedValue<Enum>& entry : table)
    if (entry.value == value) return entry.name;
  return "?";
}

// The value named `name` in `table` (case-sensitive), or nothing.
template <typename Enum, std::size_t N>
std::optional<Enum> valueNamed(const NamedValue<Enum> (&table)[N], std::string_view name) {
  for (const NamedValue<Enum>& entry : table)
    if (name == entry.name) return entry.value;
  return std::nullopt;
}

// The table's names in order, joined by `separator` and, before the last, `last_separator`:
// "fp32, tf32, bf16, fp16" or "none, stage or layer".
template <typename Enum, std::size_t N>
std::string namesOf(const NamedValue<Enum> (&table)[N], std::string_view separator = ", ",
                    std::string_view last_separator = ", ") {
  std::string text;
  for (std::size_t i = 0; i < N; ++i) {
    if (i > 0) text += i + 1 == N ? last_separator : separator;
    text += table[i].name;
  }
  return text;
}

// The value named `text` in `table`; otherwise throws the ConfigError
// "unknown <what> '<text>' (expected a, b or c)".
template <typename Enum, std::size_t N>
Enum parseNamed(const NamedValue<Enum> (&table)[N], const std::string& text, const char* what) {
  if (auto value = valueNamed(table, text)) return *value;
  CHORUS_THROW(ConfigError, "unknown ", what, " '", text, "' (expected ",
               namesOf(table, ", ", " or "), ")");
}

}  // namespace chorus
