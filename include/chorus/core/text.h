// Small text helpers that several layers need alike: ASCII case folding and comparisons that
// ignore case (names of catalog entries, archive records).
#pragma once

#include <string>
#include <string_view>

namespace chorus {

// `text` with ASCII letters in lower case; other bytes unchanged.
std::string lowercase(std::string text);

// Whether `a` and `b` are equal ignoring ASCII case.
bool equalsIgnoringCase(std::string_view a, std::string_view b);

// Whether `text` ends with `suffix`, ignoring ASCII case.
bool endsWithIgnoringCase(std::string_view text, std::string_view suffix);

}  // namespace chorus
