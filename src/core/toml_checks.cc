// What chorus::Config checks of TOML text around toml++; see toml_checks.h.
#include "chorus/core/toml_checks.h"

#include <cstdint>

#include "chorus/core/error.h"

namespace chorus::detail {
namespace {

void requireWritableNode(const toml::node& node, const std::string& source);

void requireWritableTable(const toml::table& table, const std::string& source) {
  for (const auto& [key, value] : table) {
    if (!isWritableKey(key.str())) {
      const toml::source_position& where = key.source().begin;
      CHORUS_THROW(ConfigError, source, ":", where.line, ":", where.column, ": ",
                   unwritableKeyMessage(key.str()));
    }
    requireWritableNode(value, source);
  }
}

void requireWritableNode(const toml::node& node, const std::string& source) {
  if (const toml::table* table = node.as_table()) {
    requireWritableTable(*table, source);
  } else if (const toml::array* array = node.as_array()) {
    for (const toml::node& element : *array) requireWritableNode(element, source);
  }
}

}  // namespace

bool isWritableKey(std::string_view key) {
  for (const char c : key) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\'' || byte < 0x20 || byte == 0x7f) return false;
  }
  return true;
}

std::string escaped(std::string_view text) {
  static const char kHex[] = "0123456789abcdef";
  std::string shown;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte > 0x7e) {
      shown += "\\x";
      shown += kHex[byte >> 4];
      shown += kHex[byte & 15];
    } else {
      shown += c;
    }
  }
  return shown;
}

bool isUtf8(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    std::size_t length = 0;
    std::uint32_t code = 0;
    if (lead < 0x80) {
      ++i;
      continue;
    } else if ((lead & 0xe0) == 0xc0) {
      length = 2;
      code = lead & 0x1f;
    } else if ((lead & 0xf0) == 0xe0) {
      length = 3;
      code = lead & 0x0f;
    } else if ((lead & 0xf8) == 0xf0) {
      length = 4;
      code = lead & 0x07;
    } else {
      return false;
    }
    if (i + length > text.size()) return false;
    for (std::size_t k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xc0) != 0x80) return false;
      code = (code << 6) | (next & 0x3f);
    }
    static constexpr std::uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
    if (code < kSmallest[length] || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff))
      return false;
    i += length;
  }
  return true;
}

std::string unwritableKeyMessage(std::string_view key) {
  const std::string shown = escaped(key);
  return "config key '" + shown +
         "' holds a single quote or a control character, which chorus cannot keep in its "
         "canonical TOML; chorus's keys are plain words (letters, digits, '_', '-')";
}

void requireWritableKeys(const toml::table& root, const std::string& source) {
  requireWritableTable(root, source);
}

}  // namespace chorus::detail
