// What chorus checks of TOML text around toml++: the gaps of toml++ 3.3 (Debian 12) that the
// fuzz targets found. chorus::Config applies all of them; every reader of TOML text parses it with
// parseToml below, never toml::parse.
//
// Keys.
// Config keeps every document it read as canonical TOML (Config::toToml, e.g. in checkpoints),
// written by toml++'s formatter. toml++ 3.3 (Debian 12) writes a key that holds a single quote
// or a control character without quotes, as text that no TOML reader accepts, so such a key
// could be read but not kept. chorus's own keys are plain words (letters, digits, '_', '-'), so
// Config refuses those keys when it reads them, with a ConfigError naming the key and where it
// is, instead of writing canonical TOML that does not parse (found by fuzz/config_fuzzer.cc).
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include <toml++/toml.h>

namespace chorus::detail {

// Whether toml++ writes `key` back as a key it reads again.
bool isWritableKey(std::string_view key);

// Throws ConfigError ("SOURCE:LINE:COL: config key 'K' ...") for the first key in `root`, at any
// depth (tables, arrays of tables, inline tables in arrays), that is not writable.
void requireWritableKeys(const toml::table& root, const std::string& source);

// The message for an unwritable key, without the location.
std::string unwritableKeyMessage(std::string_view key);

// Whether `text` is valid UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
// TOML documents must be; toml++ checks them, but `--set` text comes from a command line, and
// toml++ writes a key or string that is not UTF-8 as other text than it holds (found by
// fuzz/config_fuzzer.cc: a key "steps\xd9" came back as a second "steps").
bool isUtf8(std::string_view text);

// The code point of the well-formed UTF-8 sequence that starts at text[i], and its length in
// bytes; {0, 0} where none starts there (ASCII, a continuation byte, a sequence cut short or
// overlong, past U+10FFFF). Surrogates are decoded: whether they are text is the caller's call.
std::pair<char32_t, std::size_t> utf8At(std::string_view text, std::size_t i);

// Appends `c` to `out` as UTF-8.
void appendUtf8(std::string& out, char32_t c);

// `text` with control characters and bytes above 0x7e shown as \xNN, for messages.
std::string escaped(std::string_view text);

// toml::parse (it throws toml::parse_error alike), without the undefined behaviour of toml++ 3.3
// (Debian 12): its test for non-ASCII whitespace reaches __builtin_unreachable() for most of
// U+00A1..U+0499 (Latin, Greek and Cyrillic letters), U+2C6E..U+3067 and U+FC26..U+FEFE, wherever
// the parser asks whether a character is whitespace: in a bare key or value, after a quote inside
// a bare word, after a line-ending backslash in a string. Found by the fuzz targets, three times
// in different places. Instead of guessing where toml++ asks, no such code point ever reaches
// it: they are moved to the same place in plane 15 (private use), or in the first plane whose
// images the document does not hold itself, while toml++ reads, and moved back in every key,
// string and error message of the result. Only a document holding images in all of planes 1-16
// is refused (ConfigError).
toml::table parseToml(std::string_view text, std::string_view source);

}  // namespace chorus::detail
