#include "chorus/core/config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>
#include <sstream>
#include <string_view>
#include <tuple>

#include <toml++/toml.h>

#include "chorus/core/error.h"
#include "chorus/core/input_file.h"
#include "chorus/core/name_table.h"
#include "chorus/core/toml_checks.h"

namespace chorus {
namespace {

// Beyond this many edits a suggestion is more likely noise than the key the user meant.
constexpr size_t kMaxSuggestionDistance = 2;

std::string trim(const std::string& text) {
  size_t begin = 0, end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  return text.substr(begin, end - begin);
}

// Splits "a.b.c" into its components; an empty component (a..b, .a, a.) is an error.
std::vector<std::string> splitKey(const std::string& key) {
  std::vector<std::string> parts;
  size_t begin = 0;
  while (true) {
    const size_t dot = key.find('.', begin);
    parts.push_back(key.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin));
    if (parts.back().empty())
      CHORUS_THROW(ConfigError, "invalid config key '", key, "': empty component in dotted path");
    if (dot == std::string::npos) break;
    begin = dot + 1;
  }
  return parts;
}

// "a string", "an integer", ... for messages.
const char* describe(const toml::node& node) {
  static constexpr NamedValue<toml::node_type> kDescriptions[] = {
      {toml::node_type::none, "nothing"},       {toml::node_type::table, "a table"},
      {toml::node_type::array, "an array"},     {toml::node_type::string, "a string"},
      {toml::node_type::integer, "an integer"}, {toml::node_type::floating_point, "a float"},
      {toml::node_type::boolean, "a boolean"},  {toml::node_type::date, "a date"},
      {toml::node_type::time, "a time"},        {toml::node_type::date_time, "a date-time"}};
  return nameOf(kDescriptions, node.type());
}

// Reads an array element (or a value) of TOML type T into `out`; false when it is another type.
template <typename T>
bool readAs(const toml::node& node, T& out) {
  const auto* value = node.as<T>();
  if (value) out = value->get();
  return value != nullptr;
}

// TOML has nan and inf; no setting of a job means either, and a deadline of inf seconds
// overflows when it becomes milliseconds. Named in messages as the file wrote them.
std::string describeFloat(double value) {
  if (std::isnan(value)) return "nan";
  return value > 0 ? "inf" : "-inf";
}

size_t editDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// Whether `key` equals `prefix` or lies under it ("a.b" is under "a", "ab" is not).
bool isUnder(const std::string& key, const std::string& prefix) {
  return key == prefix || (key.size() > prefix.size() &&
                           key.compare(0, prefix.size(), prefix) == 0 && key[prefix.size()] == '.');
}

}  // namespace

struct Config::Impl {
  toml::table root;
  std::string source = "<empty>";
  // Keys (or tables) that a --set assignment wrote; their values report "--set" as their origin.
  std::set<std::string> cli_keys;
  // Mutable because reads through a const Config still register the keys they consult; that
  // record is what rejectUnknownKeys() checks against.
  mutable std::set<std::string> known_keys;
  mutable std::set<std::string> known_tables;

  const toml::node* find(const std::string& key) const {
    const toml::node* node = &root;
    for (const std::string& part : splitKey(key)) {
      const toml::table* table = node->as_table();
      if (table == nullptr) return nullptr;
      node = table->get(part);
      if (node == nullptr) return nullptr;
    }
    return node;
  }

  // Where a value came from, for messages: "job.toml line 7" or "--set".
  std::string origin(const std::string& key, const toml::node& node) const {
    for (const std::string& cli : cli_keys)
      if (isUnder(key, cli)) return "--set";
    return detail::concat(source, " line ", node.source().begin.line);
  }

  // Marks `key` known and returns its node, or nullptr when absent.
  const toml::node* read(const std::string& key) const {
    const toml::node* node = find(key);
    known_keys.insert(key);
    return node;
  }

  [[noreturn]] void wrongType(const std::string& key, const toml::node& node,
                              const std::string& expected, const std::string& got) const {
    CHORUS_THROW(ConfigError, "config key '", key, "' (", origin(key, node), "): expected ",
                 expected, ", got ", got);
  }

  // The value at `key` when it has TOML type T (int64_t, bool, std::string), else ConfigError.
  template <typename T>
  T readValue(const std::string& key, const T& fallback, const char* expected) const {
    const toml::node* node = read(key);
    if (node == nullptr) return fallback;
    T value;
    if (!readAs(*node, value)) wrongType(key, *node, expected, describe(*node));
    return value;
  }

  template <typename T, typename Accept>
  std::vector<T> readArray(const std::string& key, const std::vector<T>& fallback,
                           const char* expected, Accept accept) const {
    const toml::node* node = read(key);
    if (node == nullptr) return fallback;
    const toml::array* array = node->as_array();
    if (array == nullptr) wrongType(key, *node, expected, describe(*node));
    std::vector<T> values;
    for (size_t i = 0; i < array->size(); ++i) {
      const toml::node& element = *array->get(i);
      T value;
      if (!accept(element, value))
        wrongType(key, *node, expected,
                  detail::concat("an array whose element ", i, " is ", describe(element)));
      values.push_back(std::move(value));
    }
    return values;
  }

  // Appends every leaf key under `table` (values and arrays; tables are descended into).
  void collectLeaves(const toml::table& table, const std::string& prefix,
                     std::vector<std::pair<std::string, const toml::node*>>& out) const {
    for (auto&& [name, node] : table) {
      const std::string key =
          prefix.empty() ? std::string(name.str()) : prefix + "." + std::string(name.str());
      if (const toml::table* child = node.as_table())
        collectLeaves(*child, key, out);
      else
        out.emplace_back(key, &node);
    }
  }

  bool isKnown(const std::string& key) const {
    if (known_keys.count(key)) return true;
    for (const std::string& table : known_tables)
      if (isUnder(key, table)) return true;
    return false;
  }
};

Config::Config() : impl_(std::make_unique<Impl>()) {}
Config::~Config() = default;
Config::Config(const Config& other) : impl_(std::make_unique<Impl>(*other.impl_)) {}
Config& Config::operator=(const Config& other) {
  if (this != &other) impl_ = std::make_unique<Impl>(*other.impl_);
  return *this;
}
// A moved-from Config is left empty but usable, never with a null impl_.
Config::Config(Config&& other) noexcept : impl_(std::make_unique<Impl>()) {
  std::swap(impl_, other.impl_);
}
Config& Config::operator=(Config&& other) noexcept {
  std::swap(impl_, other.impl_);
  return *this;
}

Config Config::parseFile(const std::string& path) {
  return parseString(readInputFile(path, "config file"), path);
}

Config Config::parseString(const std::string& text, const std::string& source) {
  Config config;
  config.impl_->source = source;
  try {
    config.impl_->root = detail::parseToml(text, source);
  } catch (const toml::parse_error& error) {
    const toml::source_position& where = error.source().begin;
    CHORUS_THROW(ConfigError, source, ":", where.line, ":", where.column, ": ",
                 error.description());
  }
  detail::requireWritableKeys(config.impl_->root, source);
  return config;
}

void Config::set(const std::string& assignment) {
  const size_t equals = assignment.find('=');
  if (equals == std::string::npos)
    CHORUS_THROW(ConfigError, "invalid --set '", assignment, "': expected KEY=VALUE");
  const std::string key = trim(assignment.substr(0, equals));
  const std::string text = trim(assignment.substr(equals + 1));
  if (!detail::isUtf8(assignment))
    CHORUS_THROW(ConfigError, "invalid --set '", detail::escaped(assignment), "': not UTF-8 text");
  if (key.empty()) CHORUS_THROW(ConfigError, "invalid --set '", assignment, "': empty key");
  const std::vector<std::string> parts = splitKey(key);
  for (const std::string& part : parts)
    if (!detail::isWritableKey(part))
      CHORUS_THROW(ConfigError, "invalid --set '", assignment,
                   "': ", detail::unwritableKeyMessage(key));

  // Read VALUE as exactly one TOML value; anything else (a bare word, a device list, text that
  // would smuggle in a second key) is kept verbatim as a string.
  toml::table parsed;
  bool is_value = false;
  try {
    const std::string document = "v = " + text + "\n";
    parsed = detail::parseToml(document, "--set");
    is_value = parsed.size() == 1 && parsed.get("v") != nullptr;
  } catch (const toml::parse_error&) {
    is_value = false;  // e.g. a bare word, ASCII or not: kept as text
  } catch (const ConfigError&) {
    is_value = false;  // text parseToml refuses to read (toml_checks.h): kept as text too
  }
  if (is_value) detail::requireWritableKeys(parsed, "--set " + key);

  toml::table* table = &impl_->root;
  std::string prefix;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    prefix += (i ? "." : "") + parts[i];
    toml::node* child = table->get(parts[i]);
    if (child == nullptr) {
      table = table->insert_or_assign(parts[i], toml::table{}).first->second.as_table();
      continue;
    }
    if (!child->is_table())
      CHORUS_THROW(ConfigError, "invalid --set '", assignment, "': '", prefix, "' is ",
                   describe(*child), ", not a table");
    table = child->as_table();
  }
  if (is_value)
    table->insert_or_assign(parts.back(), std::move(*parsed.get("v")));
  else
    table->insert_or_assign(parts.back(), text);
  impl_->cli_keys.insert(key);
}

bool Config::has(const std::string& key) const { return impl_->find(key) != nullptr; }

bool Config::isArray(const std::string& key) const {
  const toml::node* node = impl_->find(key);
  return node != nullptr && node->is_array();
}

double Config::getDouble(const std::string& key, double fallback) const {
  const toml::node* node = impl_->read(key);
  if (node == nullptr) return fallback;
  if (const auto* value = node->as_floating_point()) {
    if (!std::isfinite(value->get()))
      impl_->wrongType(key, *node, "a finite number", describeFloat(value->get()));
    return value->get();
  }
  if (const auto* value = node->as_integer()) return static_cast<double>(value->get());
  impl_->wrongType(key, *node, "a number", describe(*node));
}

int64_t Config::getInt(const std::string& key, int64_t fallback) const {
  return impl_->readValue<int64_t>(key, fallback, "an integer");
}

bool Config::getBool(const std::string& key, bool fallback) const {
  return impl_->readValue<bool>(key, fallback, "a boolean");
}

std::string Config::getString(const std::string& key, const std::string& fallback) const {
  return impl_->readValue<std::string>(key, fallback, "a string");
}

std::vector<int64_t> Config::getInts(const std::string& key,
                                     const std::vector<int64_t>& fallback) const {
  return impl_->readArray<int64_t>(key, fallback, "an array of integers", readAs<int64_t>);
}

std::vector<double> Config::getDoubles(const std::string& key,
                                       const std::vector<double>& fallback) const {
  return impl_->readArray<double>(key, fallback, "an array of finite numbers",
                                  [](const toml::node& node, double& out) {
                                    if (const auto* value = node.as_floating_point()) {
                                      out = value->get();
                                      return std::isfinite(out);
                                    }
                                    if (const auto* value = node.as_integer()) {
                                      out = static_cast<double>(value->get());
                                      return true;
                                    }
                                    return false;
                                  });
}

std::vector<std::string> Config::getStrings(const std::string& key,
                                            const std::vector<std::string>& fallback) const {
  return impl_->readArray<std::string>(key, fallback, "an array of strings", readAs<std::string>);
}

void Config::allowTable(const std::string& key) const {
  splitKey(key);  // validates
  impl_->known_tables.insert(key);
}

void Config::rejectUnknownKeys() const {
  std::vector<std::pair<std::string, const toml::node*>> leaves;
  impl_->collectLeaves(impl_->root, "", leaves);

  struct Unknown {
    bool from_cli;
    uint32_t line;
    std::string key;
    std::string origin;
  };
  std::vector<Unknown> unknown;
  for (const auto& [key, node] : leaves) {
    if (impl_->isKnown(key)) continue;
    const std::string origin = impl_->origin(key, *node);
    unknown.push_back({origin == "--set", node->source().begin.line, key, origin});
  }
  if (unknown.empty()) return;
  // File keys in line order, then command-line keys.
  std::sort(unknown.begin(), unknown.end(), [](const Unknown& a, const Unknown& b) {
    return std::tie(a.from_cli, a.line, a.key) < std::tie(b.from_cli, b.line, b.key);
  });

  std::ostringstream message;
  message << (unknown.size() == 1 ? "unknown config key: " : "unknown config keys: ");
  for (size_t i = 0; i < unknown.size(); ++i) {
    const Unknown& entry = unknown[i];
    message << (i ? ", " : "") << "'" << entry.key << "' (" << entry.origin;
    std::string best;
    size_t best_distance = kMaxSuggestionDistance + 1;
    for (const std::string& candidate : impl_->known_keys) {
      const size_t distance = editDistance(entry.key, candidate);
      if (distance < best_distance) {
        best = candidate;
        best_distance = distance;
      }
    }
    if (!best.empty()) message << "; did you mean '" << best << "'?";
    message << ")";
  }
  CHORUS_THROW(ConfigError, message.str());
}

std::string Config::toToml() const {
  std::ostringstream out;
  out << toml::toml_formatter(impl_->root);
  std::string text = out.str();
  if (!text.empty() && text.back() != '\n') text += '\n';
  return text;
}

std::string Config::source() const { return impl_->source; }

}  // namespace chorus
