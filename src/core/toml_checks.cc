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

void appendUtf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

std::pair<char32_t, std::size_t> utf8At(std::string_view text, std::size_t i) {
  const auto lead = static_cast<unsigned char>(text[i]);
  std::size_t length = 0;
  char32_t code = 0;
  if ((lead & 0xE0) == 0xC0) {
    length = 2;
    code = lead & 0x1F;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3;
    code = lead & 0x0F;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4;
    code = lead & 0x07;
  } else {
    return {0, 0};
  }
  if (i + length > text.size()) return {0, 0};
  for (std::size_t k = 1; k < length; ++k) {
    const auto next = static_cast<unsigned char>(text[i + k]);
    if ((next & 0xC0) != 0x80) return {0, 0};
    code = (code << 6) | (next & 0x3F);
  }
  static constexpr char32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
  if (code < kSmallest[length] || code > 0x10FFFF) return {0, 0};
  return {code, length};
}

bool isUtf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const auto [code, length] = utf8At(text, i);
    if (length == 0 || (code >= 0xD800 && code <= 0xDFFF)) return false;
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
