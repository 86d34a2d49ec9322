#include "io/json_reader.h"

#include <cctype>
#include <cmath>

#include "chorus/core/error.h"

namespace chorus::plan {
namespace {

nlohmann::json parseOrThrow(const std::string& text, const std::string& source) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& error) {
    CHORUS_THROW(ConfigError, source, ":", JsonLines::lineOfOffset(text, error.byte), ": ",
                 "malformed JSON (", error.what(), ")");
  } catch (const nlohmann::json::exception& error) {
    // Not only parse_error: a number too large for a double ("1e400") is an out_of_range, which
    // escaped as a bare nlohmann exception (found by fuzz/plan_json_fuzzer.cc).
    CHORUS_THROW(ConfigError, source, ": malformed JSON (", error.what(), ")");
  }
}

}  // namespace

std::string readablePointer(const std::string& pointer) {
  std::string out;
  size_t i = 0;
  while (i < pointer.size()) {
    const size_t next = pointer.find('/', i + 1);
    const std::string part =
        pointer.substr(i + 1, next == std::string::npos ? std::string::npos : next - i - 1);
    const bool index = !part.empty() && std::isdigit(static_cast<unsigned char>(part[0]));
    out += index ? "[" + part + "]" : (out.empty() ? "" : ".") + part;
    if (next == std::string::npos) break;
    i = next;
  }
  return out.empty() ? "(top level)" : out;
}

JsonReader::JsonReader(const std::string& text, std::string source)
    : source_(std::move(source)), root_(parseOrThrow(text, source_)), lines_(text) {
  if (lines_.maxDepth() > JsonLines::kTrackedDepth)
    CHORUS_THROW(ConfigError, source_, ": JSON nested ", lines_.maxDepth(),
                 " levels deep; chorus files nest at most ", JsonLines::kTrackedDepth);
}

void JsonReader::fail(const std::string& pointer, const std::string& what) const {
  CHORUS_THROW(ConfigError, source_, ":", lines_.line(pointer), ": ", readablePointer(pointer),
               ": ", what);
}

const nlohmann::json* JsonReader::find(const std::string& pointer) const {
  const nlohmann::json::json_pointer path(pointer);
  return root_.contains(path) ? &root_.at(path) : nullptr;
}

bool JsonReader::has(const std::string& pointer) const { return find(pointer) != nullptr; }

void JsonReader::require(const std::string& pointer) const {
  if (has(pointer)) return;
  const size_t slash = pointer.rfind('/');
  const std::string parent = pointer.substr(0, slash);
  fail(parent, "missing key '" + pointer.substr(slash + 1) + "'");
}

const nlohmann::json& JsonReader::object(const std::string& pointer,
                                         std::initializer_list<const char*> known) const {
  require(pointer);
  const nlohmann::json& value = *find(pointer);
  if (!value.is_object()) fail(pointer, "must be an object");
  for (auto item = value.begin(); item != value.end(); ++item) {
    bool ok = false;
    std::string list;
    for (const char* name : known) {
      ok = ok || item.key() == name;
      list += (list.empty() ? "" : ", ") + std::string(name);
    }
    if (!ok) fail(pointer + "/" + item.key(), "unknown key '" + item.key() + "'; known: " + list);
  }
  return value;
}

const nlohmann::json& JsonReader::array(const std::string& pointer) const {
  require(pointer);
  const nlohmann::json& value = *find(pointer);
  if (!value.is_array()) fail(pointer, "must be an array");
  return value;
}

double JsonReader::number(const std::string& pointer, double fallback, double min) const {
  const nlohmann::json* value = find(pointer);
  if (!value) return fallback;
  if (!value->is_number() || !std::isfinite(value->get<double>()) || value->get<double>() < min)
    fail(pointer, detail::concat("must be a number >= ", min));
  return value->get<double>();
}

long long JsonReader::integer(const std::string& pointer, long long fallback, long long min,
                              long long max) const {
  const nlohmann::json* value = find(pointer);
  if (!value) return fallback;
  if (!value->is_number_integer() || value->get<long long>() < min || value->get<long long>() > max)
    fail(pointer,
         "must be an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
  return value->get<long long>();
}

std::string JsonReader::text(const std::string& pointer, const std::string& fallback) const {
  const nlohmann::json* value = find(pointer);
  if (!value) return fallback;
  if (!value->is_string()) fail(pointer, "must be a string");
  return value->get<std::string>();
}

bool JsonReader::flag(const std::string& pointer, bool fallback) const {
  const nlohmann::json* value = find(pointer);
  if (!value) return fallback;
  if (!value->is_boolean()) fail(pointer, "must be true or false");
  return value->get<bool>();
}

}  // namespace chorus::plan
