// The job configuration: a TOML document plus command-line overrides, read through typed getters.
//
// There is no separate schema: the code that reads a key with a default *is* the schema. Each
// typed read marks its key as known; after every component has read its keys, the caller invokes
// rejectUnknownKeys(), which turns any key that nobody read (a typo, a stale option) into one
// ConfigError listing all of them with their source lines and a "did you mean" where one is close.
// Parsed once at start-up and passed explicitly (invariant 3, docs/architecture.md, "Invariants":
// no hidden global state).
//
// Keys are dotted paths through nested tables: "optimizer.lr" is key `lr` of table `optimizer`,
// whether the file wrote `[optimizer] lr = 0.1` or `optimizer.lr = 0.1`. Quoted TOML keys that
// contain dots cannot be addressed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace chorus {

// A parsed job configuration. Value type: copies are deep and independent (including the record
// of which keys were read). Not thread-safe, not even for concurrent const calls: every typed read
// records its key in a mutable set of known keys (so that a component holding a `const Config&`
// can still take part in unknown-key detection).
class Config {
 public:
  // An empty configuration; every read returns its fallback.
  Config();
  ~Config();
  Config(const Config& other);
  Config& operator=(const Config& other);
  Config(Config&& other) noexcept;
  Config& operator=(Config&& other) noexcept;

  // Parses a TOML file. Throws ConfigError naming the file when it cannot be read (missing, a
  // directory, larger than kMaxInputFileBytes), and
  // "FILE:LINE:COL: <parser message>" on a syntax error.
  static Config parseFile(const std::string& path);
  // Parses TOML text; `source` names it in messages.
  static Config parseString(const std::string& text, const std::string& source = "<config>");

  // Applies one `--set KEY=VALUE` override. KEY is a dotted path; missing tables are created, an
  // existing value is replaced. VALUE is read as a TOML value (42, 0.5, true, "x", [1, 2]) and,
  // when it is not one, taken verbatim as a string, so `devices=cpu@1.0,cpu@0.5` needs no quotes.
  // Throws ConfigError when there is no '=', the key is malformed, or a path component names a
  // value that is not a table.
  void set(const std::string& assignment);

  // Whether `key` is present (as a value or a table). Does not mark it as known.
  bool has(const std::string& key) const;
  // Whether `key` is present and an array (for keys that take a word or a list). Does not mark
  // it as known.
  bool isArray(const std::string& key) const;

  // Typed reads: the value at `key`, or `fallback` when it is absent. Each marks `key` as known.
  // A present value of the wrong type throws ConfigError, e.g.
  //   config key 'optimizer.lr' (job.toml line 7): expected a number, got a string
  // getDouble also accepts an integer; getInt does not accept a float. Neither getDouble nor
  // getDoubles accepts nan or inf (no setting means them).
  double getDouble(const std::string& key, double fallback) const;
  int64_t getInt(const std::string& key, int64_t fallback) const;
  bool getBool(const std::string& key, bool fallback) const;
  std::string getString(const std::string& key, const std::string& fallback) const;
  std::vector<int64_t> getInts(const std::string& key, const std::vector<int64_t>& fallback) const;
  std::vector<double> getDoubles(const std::string& key, const std::vector<double>& fallback) const;
  std::vector<std::string> getStrings(const std::string& key,
                                      const std::vector<std::string>& fallback) const;

  // Marks a whole table (every key under `key`) as known, for free-form sub-tables that are
  // passed on verbatim rather than read key by key.
  void allowTable(const std::string& key) const;

  // Throws ConfigError when any key present in the document or set on the command line was never
  // read (nor lies under an allowed table). The message lists every such key in source order with
  // its line (or "--set") and, when a read key is within edit distance 2, "did you mean '...'?".
  // Call once, after all components have read their settings.
  void rejectUnknownKeys() const;

  // Canonical TOML text of the whole tree, keys sorted (for logs and checkpoints). Parsing it
  // back gives equal reads.
  std::string toToml() const;

  // The file path or name this configuration was parsed from.
  std::string source() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace chorus
