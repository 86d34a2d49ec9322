// Checked reading of JSON input files (model profiles, plans): typed field access whose errors
// name the file, the line and the key, as the TOML readers' do.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>

#include "io/json_lines.h"

namespace chorus::plan {

// Parses `text` on construction (throwing ConfigError "source:line: ..." on malformed JSON) and
// reads fields of it. A value is addressed by its JSON pointer; `where` strings in messages are
// the pointer made readable ("layers[3]"). Not copyable; single-threaded.
class JsonReader {
 public:
  JsonReader(const std::string& text, std::string source);
  JsonReader(const JsonReader&) = delete;
  JsonReader& operator=(const JsonReader&) = delete;

  const nlohmann::json& root() const { return root_; }

  [[noreturn]] void fail(const std::string& pointer, const std::string& what) const;

  // Throws unless the value at `pointer` is an object, then rejects keys outside `known`.
  const nlohmann::json& object(const std::string& pointer,
                               std::initializer_list<const char*> known) const;
  const nlohmann::json& array(const std::string& pointer) const;
  bool has(const std::string& pointer) const;

  double number(const std::string& pointer, double fallback, double min) const;
  long long integer(const std::string& pointer, long long fallback, long long min,
                    long long max) const;
  std::string text(const std::string& pointer, const std::string& fallback) const;
  bool flag(const std::string& pointer, bool fallback) const;
  // Throws "missing key" unless the value exists.
  void require(const std::string& pointer) const;

 private:
  const nlohmann::json* find(const std::string& pointer) const;

  std::string source_;
  nlohmann::json root_;
  JsonLines lines_;
};

// "/layers/3/params" -> "layers[3].params".
std::string readablePointer(const std::string& pointer);

}  // namespace chorus::plan
