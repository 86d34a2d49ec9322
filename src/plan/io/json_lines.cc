#include "io/json_lines.h"

#include <algorithm>
#include <vector>

namespace chorus::plan {
namespace {

struct Frame {
  bool object = false;
  std::string key;  // current key (objects)
  long index = 0;   // current index (arrays)
};

// Escapes a key for a JSON pointer (RFC 6901): '~' -> "~0", '/' -> "~1".
std::string escapeKey(const std::string& key) {
  std::string out;
  for (char c : key)
    out += c == '~' ? std::string("~0") : c == '/' ? std::string("~1") : std::string(1, c);
  return out;
}

std::string pointerOf(const std::vector<Frame>& stack) {
  std::string pointer;
  for (const auto& frame : stack)
    pointer += "/" + (frame.object ? escapeKey(frame.key) : std::to_string(frame.index));
  return pointer;
}

// Reads the string starting at text[i] == '"'; returns its raw content (escapes kept except \" and
// \\, enough for keys) and leaves i after the closing quote.
std::string readString(const std::string& text, std::size_t& i, int& line) {
  std::string out;
  for (++i; i < text.size() && text[i] != '"'; ++i) {
    if (text[i] == '\\' && i + 1 < text.size()) ++i;
    if (text[i] == '\n') ++line;
    out += text[i];
  }
  ++i;
  return out;
}

}  // namespace

JsonLines::JsonLines(const std::string& text) {
  std::vector<Frame> stack;
  int line = 1;
  bool expect_key = false;
  std::size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      ++i;
    } else if (c == ' ' || c == '\t' || c == '\r' || c == ':') {
      ++i;
    } else if (c == ',') {
      if (!stack.empty() && !stack.back().object) ++stack.back().index;
      expect_key = !stack.empty() && stack.back().object;
      ++i;
    } else if (c == '}' || c == ']') {
      if (!stack.empty()) stack.pop_back();
      expect_key = false;
      ++i;
    } else if (c == '"' && expect_key) {
      stack.back().key = readString(text, i, line);
      expect_key = false;
    } else {
      if (stack.size() <= kTrackedDepth) lines_.emplace(pointerOf(stack), line);
      if (c == '{' || c == '[') {
        stack.push_back(Frame{c == '{', "", 0});
        max_depth_ = std::max(max_depth_, stack.size());
        expect_key = c == '{';
        ++i;
      } else if (c == '"') {
        readString(text, i, line);
      } else {
        while (i < text.size() && text[i] != ',' && text[i] != '}' && text[i] != ']' &&
               text[i] != '\n' && text[i] != ' ')
          ++i;
      }
    }
  }
}

int JsonLines::line(const std::string& pointer) const {
  const auto found = lines_.find(pointer);
  return found == lines_.end() ? 1 : found->second;
}

int JsonLines::lineOfOffset(const std::string& text, std::size_t offset) {
  int line = 1;
  for (std::size_t i = 0; i < offset && i < text.size(); ++i) line += text[i] == '\n';
  return line;
}

}  // namespace chorus::plan
