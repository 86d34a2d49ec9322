// Line numbers for JSON values, so that errors in JSON input can name the line as TOML ones do.
// nlohmann::json keeps no source positions; JsonLines scans the (already validated) text once
// and maps each value's JSON pointer ("/layers/3/params") to the line where the value starts.
#pragma once

#include <cstddef>
#include <string>
#include <unordered_map>

namespace chorus::plan {

// Immutable after construction. REQUIRES: `text` is valid JSON.
class JsonLines {
 public:
  explicit JsonLines(const std::string& text);

  // The 1-based line where the value at `pointer` starts; 1 when unknown.
  int line(const std::string& pointer) const;

  // The 1-based line of byte `offset` of `text`.
  static int lineOfOffset(const std::string& text, std::size_t offset);

 private:
  std::unordered_map<std::string, int> lines_;
};

}  // namespace chorus::plan
