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

  // The 1-based line where the value at `pointer` starts; 1 when unknown (and for values nested
  // deeper than kTrackedDepth, which no chorus file has: tracking them made a deeply nested
  // file cost time quadratic in its depth).
  int line(const std::string& pointer) const;

  // How deeply the text nests arrays and objects (0 for a scalar document).
  std::size_t maxDepth() const { return max_depth_; }

  static constexpr std::size_t kTrackedDepth = 32;

  // The 1-based line of byte `offset` of `text`.
  static int lineOfOffset(const std::string& text, std::size_t offset);

 private:
  std::unordered_map<std::string, int> lines_;
  std::size_t max_depth_ = 0;
};

}  // namespace chorus::plan
