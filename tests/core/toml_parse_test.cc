// detail::parseToml: toml::parse without toml++ 3.3's unreachable point. Under the sanitizer
// pass (scripts/sanitize, UBSan), reaching that point fails these tests; in a plain build they
// check that every code point around it reads back as itself, and that errors show it as it was.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "chorus/core/config.h"
#include "chorus/core/error.h"
#include "chorus/core/toml_checks.h"

namespace chorus::detail {
namespace {

std::string utf8(char32_t c) {
  std::string out;
  appendUtf8(out, c);
  return out;
}

// The three blocks where toml++ 3.3 cannot classify a code point, their edges, and a stride
// through the rest of the BMP (surrogates are not text).
std::vector<char32_t> codePointsAround() {
  std::vector<char32_t> points;
  for (char32_t c = 0x80; c <= 0x4A0; ++c) points.push_back(c);
  for (char32_t c = 0x2C60; c <= 0x3070; ++c) points.push_back(c);
  for (char32_t c = 0xFC20; c <= 0xFFFD; ++c) points.push_back(c);
  for (char32_t c = 0x4A1; c < 0xFC20; c += 97)
    if (c < 0xD800 || c > 0xDFFF) points.push_back(c);
  return points;
}

std::string errorOf(const std::string& text) {
  try {
    parseToml(text, "t.toml");
  } catch (const toml::parse_error& error) {
    return std::string(error.description());
  } catch (const ConfigError& error) {
    return error.message();
  }
  return "";
}

TEST(ParseToml, EveryCodePointInStringsAndCommentsReadsBackAsItself) {
  for (const char32_t c : codePointsAround()) {
    if (c == 0x85 || c == 0x2028 || c == 0x2029) continue;  // toml++ takes these for line breaks
    const std::string s = utf8(c);
    const std::string text = "# " + s + "\n\"k" + s + "\" = \"a" + s + "\"\nl = 'b" + s +
                             "'\nm = \"\"\"c \\\n   " + s + "d\"\"\"\nn = '''" + s +
                             "'''\nt = { \"" + s + "\" = [\"" + s + "\"] }\n";
    SCOPED_TRACE(std::to_string(static_cast<unsigned>(c)));
    const toml::table root = parseToml(text, "t.toml");
    EXPECT_EQ(root["k" + s].value_or(std::string()), "a" + s);
    EXPECT_EQ(root["l"].value_or(std::string()), "b" + s);
    EXPECT_EQ(root["n"].value_or(std::string()), s);
    EXPECT_EQ(root["t"][s][0].value_or(std::string()), s);
    // After a line-ending backslash the whitespace that follows is trimmed; only the horizontal
    // whitespace toml++ knows goes with it.
    const std::string m = root["m"].value_or(std::string());
    EXPECT_TRUE(m == "c " + s + "d" || m == "c d") << m;
    EXPECT_TRUE(root["t"].as_table()->is_inline());
  }
}

TEST(ParseToml, EveryCodePointOutsideStringsIsAnError) {
  for (const char32_t c : codePointsAround()) {
    const std::string s = utf8(c);
    SCOPED_TRACE(std::to_string(static_cast<unsigned>(c)));
    EXPECT_NE(errorOf("k" + s + " = 1\n"), "");
    EXPECT_NE(errorOf("x = 1" + s + "\n"), "");
    EXPECT_NE(errorOf("x = [0{'0d" + s + "d']\n"), "");  // a quote inside a bare word
    EXPECT_NE(errorOf("x = 0.0adamw\"" + s + "\"\n"), "");
    EXPECT_NE(errorOf("m = \"\"\"\\" + s + "\"\"\"\n"), "");  // an escape that is none
  }
}

TEST(ParseToml, ErrorsShowTheCodePointAsItWas) {
  // toml++ quotes the character it saw as it is ...
  EXPECT_EQ(errorOf("\xce\xa9 = 1\n"),  // U+03A9
            "Error while parsing root table: expected keys, tables, whitespace or comments, saw "
            "'\xce\xa9'");
  EXPECT_EQ(errorOf("a = tr\xd0\x96\n"),
            "Error while parsing boolean: expected 'true', saw 'tr\xd0\x96'");
  // ... or escaped, after a carriage return.
  EXPECT_EQ(errorOf("a = 1\r\xce\xa9\n"),
            "Error while parsing key-value pair: expected '\\n' after '\\r', saw '\\u03A9'");
}

// The moved code points wait in plane 15, or in the first plane where the document holds none of
// their images: any document reads back as it was, the canonical TOML of a Config that holds
// both included (found by fuzz/config_fuzzer.cc: a --set value kept as text held U+FD7F and
// U+FFD7F, and the first version refused to read its canonical TOML).
TEST(ParseToml, ImagesInOtherPlanesStayThemselves) {
  const std::string omega = "\xce\xa9";  // U+03A9
  std::string images;
  for (char32_t plane = 0xF; plane <= 0x10; ++plane) images += utf8((plane << 16) + 0x3A9);
  for (char32_t plane = 0x1; plane <= 0xD; ++plane) images += utf8((plane << 16) + 0xFD7F);
  const std::string text = "a = \"" + images + omega + "\"\n" + omega + "b = 1\n";
  const std::string message = errorOf(text);
  EXPECT_NE(message.find("saw '" + omega + "'"), std::string::npos) << message;
  const toml::table root = parseToml("a = \"" + images + omega + "\"\n", "t.toml");
  EXPECT_EQ(root["a"].value_or(std::string()), images + omega);
  // Config's canonical form reads again with them.
  Config config = Config::parseString("a = \"" + omega + "\"\n");
  config.set("b=" + utf8(0xFFD7F) + "\xef\xb5\xbf");  // U+FD7F beside its plane-15 image
  EXPECT_EQ(Config::parseString(config.toToml(), "canonical").toToml(), config.toToml());
}

TEST(ParseToml, ADocumentWithImagesInEveryPlaneIsRefused) {
  std::string images;
  for (char32_t plane = 0x1; plane <= 0x10; ++plane) images += utf8((plane << 16) + 0x400);
  EXPECT_EQ(errorOf("a = \"" + images + "\xce\xa9\"\n"),
            "t.toml: the document holds U+03A9 and its image in every plane from 1 to 16, so "
            "toml++ 3.3 cannot read it");
}

// The input the cluster_file fuzz target found on a clean clone's CI (2026-12-03): U+039F after
// a quote that `[0000{` leaves inside a bare word. The first guard took it for a string.
TEST(ParseToml, TheCleanCloneFindingIsAnErrorNotUndefinedBehaviour) {
  const std::string text =
      "devices = [0000000000000000000000{'000000000d\xce\x9f"
      "dddddddddddddddddters in Metis (ATC'24) and\"nvswitch-a100\"\n";
  EXPECT_NE(errorOf(text), "");
}

// Config reads through parseToml: keys and values keep their letters, and its canonical TOML
// reads again.
TEST(ParseToml, ConfigKeepsGreekAndCyrillicKeysAndValues) {
  const Config config =
      Config::parseString("[\"\xce\xb1\xce\xb2\"]\n\"\xd0\x96\" = \"\xd0\xbf\xd1\x80\xd0\xb8\"\n");
  EXPECT_EQ(config.getString("\xce\xb1\xce\xb2.\xd0\x96", ""), "\xd0\xbf\xd1\x80\xd0\xb8");
  const Config again = Config::parseString(config.toToml(), "canonical");
  EXPECT_EQ(again.toToml(), config.toToml());
}

}  // namespace
}  // namespace chorus::detail
