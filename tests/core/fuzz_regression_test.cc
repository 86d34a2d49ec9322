// Inputs that the fuzz targets of fuzz/ found to break a core parser, each pinned down as the
// behaviour it must have now (docs/security.md, "Fuzzing": the findings and their fixes).
#include <gtest/gtest.h>

#include <string>

#include "chorus/core/config.h"
#include "chorus/core/error.h"

namespace chorus {
namespace {

std::string configError(const std::string& text) {
  try {
    Config::parseString(text, "job.toml");
  } catch (const ConfigError& error) {
    return error.message();
  }
  return "";
}

std::string setError(const std::string& assignment) {
  Config config;
  try {
    config.set(assignment);
  } catch (const ConfigError& error) {
    return error.message();
  }
  return "";
}

// fuzz/config_fuzzer.cc: `--set "train'.x=1"` made a table named train' that toToml() wrote as
// `[train']`, which no TOML reader accepts (toml++ 3.3 writes such keys unquoted), so the
// canonical TOML kept in checkpoints could not be read back. Such keys are refused on reading.
TEST(ConfigFuzzRegression, KeyWithASingleQuoteIsRefusedInDocumentsAndSets) {
  EXPECT_EQ(configError("x = 1\n[\"train'\"]\nsteps = 4\n"),
            "job.toml:2:2: config key 'train'' holds a single quote or a control character, "
            "which chorus cannot keep in its canonical TOML; chorus's keys are plain words "
            "(letters, digits, '_', '-')");
  EXPECT_NE(configError("[a]\n\"b'c\" = 1\n").find("config key 'b'c'"), std::string::npos);
  EXPECT_NE(configError("a = [{ \"x'\" = 1 }]\n").find("config key 'x''"), std::string::npos);
  EXPECT_NE(setError("train'.stepcpu=1").find("invalid --set 'train'.stepcpu=1': config key"),
            std::string::npos);
  EXPECT_NE(setError("a = { \"x'y\" = 1 }").find("config key 'x'y'"), std::string::npos);
}

TEST(ConfigFuzzRegression, KeyWithAControlCharacterIsRefusedAndShownEscaped) {
  EXPECT_NE(configError("\"a\\tb\" = 1\n").find("config key 'a\\x09b'"), std::string::npos);
  EXPECT_NE(configError("\"a\\nb\" = 1\n").find("config key 'a\\x0ab'"), std::string::npos);
}

// fuzz/config_fuzzer.cc: `--set "train.steps\xd9=8"` (not UTF-8) made a key that toml++ wrote
// as a second "steps", so the canonical TOML failed to parse ("cannot redefine existing integer").
// --set text must be UTF-8, as TOML documents must.
TEST(ConfigFuzzRegression, SetThatIsNotUtf8IsRefused) {
  EXPECT_EQ(setError("train.steps\xd9=8"), "invalid --set 'train.steps\\xd9=8': not UTF-8 text");
  EXPECT_NE(setError("name=caf\xc3"), "");       // a sequence cut short
  EXPECT_NE(setError("name=\xed\xa0\x80"), "");  // a surrogate
  EXPECT_NE(setError("name=\xc0\xaf"), "");      // an overlong '/'
  EXPECT_EQ(setError("name=caf\xc3\xa9"), "");   // é
}

// fuzz/config_fuzzer.cc (UBSan): `[tr\u01dbn]` made toml++ 3.3 reach __builtin_unreachable()
// (its test for non-ASCII whitespace misses U+00A1..U+0499), undefined behaviour on every
// non-ASCII letter in a bare key or value. toml++ never sees those code points now
// (detail::parseToml, tests/core/toml_parse_test.cc): outside strings and comments, which TOML
// does not allow, they are its error; inside them they stay accepted.
TEST(ConfigFuzzRegression, NonAsciiOutsideStringsIsAnErrorNotUndefinedBehaviour) {
  EXPECT_EQ(configError("x = 1\n[tr\xc7\x9bn]\nsteps = 4\n"),
            "job.toml:2:4: Error while parsing table header: expected ']', saw '\xc7\x9b'");
  EXPECT_NE(configError("caf\xc3\xa9 = 1\n"), "");
  EXPECT_NE(configError("x = 1\xce\xb1\n"), "");
  EXPECT_NE(configError("x = \"a\" \xd0\x96\n"), "");
  const Config config = Config::parseString(
      "# caf\xc3\xa9\n\"caf\xc3\xa9\" = \"\xce\xb1\\\"\xd0\x96\"\n"
      "m = \"\"\"\xc3\xa9\n\"\xc3\xa9\"\"\"\"\nl = '\xc3\xa9'\nml = '''\xc3\xa9''''\n"
      "after = \"\xc3\xa9\" # \xc3\xa9\n");
  EXPECT_EQ(config.getString("caf\xc3\xa9", ""), "\xce\xb1\"\xd0\x96");
  EXPECT_EQ(config.getString("m", ""), "\xc3\xa9\n\"\xc3\xa9\"");
  EXPECT_EQ(config.getString("ml", ""), "\xc3\xa9'");
  EXPECT_EQ(config.getString("after", ""), "\xc3\xa9");
}

// The same toml++ path read every --set VALUE ("v = VALUE"): a bare non-ASCII word is kept
// verbatim as a string, as other bare words are, without reaching toml++.
TEST(ConfigFuzzRegression, NonAsciiSetValueIsKeptAsText) {
  Config config;
  config.set("data.name=caf\xc3\xa9");
  config.set("data.list=[1, \xc3\xa9]");
  EXPECT_EQ(config.getString("data.name", ""), "caf\xc3\xa9");
  EXPECT_EQ(config.getString("data.list", ""), "[1, \xc3\xa9]");
}

// fuzz/config_fuzzer.cc (UBSan, second finding): in `--set "lr = 0.0adamw\"...\xc8\xa8"` the quote
// sits inside a bare word, where toml++ does not open a string but reads on, and reached the
// same unreachable point at U+0228 (the first guard, a scan for non-ASCII outside strings, took
// the quote for a string's).
TEST(ConfigFuzzRegression, QuoteInsideABareWordOpensNoString) {
  EXPECT_NE(configError("x = 0.0adamw\"\xc8\xa8\"\n"), "");
  Config config;
  config.set("optimizer.lr = 0.0adamw\"``\xc8\xa8");
  EXPECT_EQ(config.getString("optimizer.lr", ""), "0.0adamw\"``\xc8\xa8");
  // Where a string may start, it still does: keys, values, arrays, inline tables, dotted keys.
  const Config ok = Config::parseString(
      "\"k\xc3\xa9\" = [\"\xc3\xa9\", '\xc3\xa9']\nt = { a = \"\xc3\xa9\" }\nd.\"\xc3\xa9\" = 1\n");
  EXPECT_EQ(ok.getStrings("k\xc3\xa9", {}).at(1), "\xc3\xa9");
}

// Keys toml++ does write back stay accepted, and their canonical TOML reads again.
TEST(ConfigFuzzRegression, OtherQuotedKeysStillRoundTrip) {
  const Config config = Config::parseString("\"a b\" = 1\n\"c\\\"d\" = 2\n\"\u00e9\" = 3\n");
  const Config again = Config::parseString(config.toToml(), "canonical");
  EXPECT_EQ(again.getInt("a b", 0), 1);
  EXPECT_EQ(again.toToml(), config.toToml());
}

}  // namespace
}  // namespace chorus
