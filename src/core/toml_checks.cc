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

void requireAsciiOutsideStrings(std::string_view text, const std::string& source) {
  enum class State { kPlain, kComment, kBasic, kLiteral, kMultiBasic, kMultiLiteral };
  State state = State::kPlain;
  std::size_t line = 1, column = 1;
  // The last character outside strings on this line, other than a space or tab ('\n' at the
  // start of a line). A quote opens a string only where TOML allows one (a key, a value, an array
  // or inline-table element): elsewhere, e.g. inside a bare word (`0.0adamw"x`), toml++ reads it
  // as part of the word and classifies what follows it (found by fuzz/config_fuzzer.cc).
  char last = '\n';
  auto opensString = [&] {
    return std::string_view("\n=[{,.").find(last) != std::string_view::npos;
  };
  auto at = [&](std::size_t i, std::string_view token) {
    return text.substr(i, token.size()) == token;
  };
  for (std::size_t i = 0; i < text.size(); ++i, ++column) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      column = 0;
      // Comments end with their line, and so do single-line strings (in any valid document).
      if (state == State::kComment || state == State::kBasic || state == State::kLiteral)
        state = State::kPlain;
      if (state == State::kPlain) last = '\n';
      continue;
    }
    switch (state) {
      case State::kPlain:
        if (static_cast<unsigned char>(c) >= 0x80)
          CHORUS_THROW(ConfigError, source, ":", line, ":", column,
                       ": non-ASCII text outside a string or comment (TOML keys and values other "
                       "than strings are ASCII; quote it)");
        if (c == '#') {
          state = State::kComment;
        } else if ((c == '"' || c == '\'') && opensString()) {
          const bool multi = at(i, c == '"' ? "\"\"\"" : "'''");
          state = c == '"' ? (multi ? State::kMultiBasic : State::kBasic)
                           : (multi ? State::kMultiLiteral : State::kLiteral);
          if (multi) i += 2;
        }
        if (c != ' ' && c != '\t') last = c;
        break;
      case State::kBasic:
      case State::kMultiBasic:
        if (c == '\\') {
          // An escaped character, possibly a quote or a backslash (a line-ending backslash
          // leaves the newline to be counted).
          if (i + 1 < text.size() && text[i + 1] != '\n') ++i;
        } else if (state == State::kBasic && c == '"') {
          state = State::kPlain;
          last = c;
        } else if (state == State::kMultiBasic && at(i, "\"\"\"")) {
          // Up to two quotes may end the content right before the closing delimiter.
          while (i + 3 < text.size() && text[i + 3] == '"' && at(i + 1, "\"\"\"")) ++i;
          i += 2;
          state = State::kPlain;
          last = '"';
        }
        break;
      case State::kLiteral:
        if (c == '\'') {
          state = State::kPlain;
          last = c;
        }
        break;
      case State::kMultiLiteral:
        if (at(i, "'''")) {
          while (i + 3 < text.size() && text[i + 3] == '\'' && at(i + 1, "'''")) ++i;
          i += 2;
          state = State::kPlain;
          last = '\'';
        }
        break;
      case State::kComment:
        break;
    }
  }
}

}  // namespace chorus::detail
