// Inputs that the fuzz targets of fuzz/ found to break a plan-layer parser, each pinned down as
// the behaviour it must have now (docs/security.md, "Fuzzing": the findings and their fixes).
#include <gtest/gtest.h>

#include <string>

#include "chorus/core/error.h"
#include "chorus/plan/cluster_file.h"
#include "chorus/plan/plan_json.h"

namespace chorus::plan {
namespace {

std::string clusterError(const std::string& text) {
  try {
    parseClusterToml(text, "c.toml");
  } catch (const ConfigError& error) {
    return error.message();
  }
  return "";
}

// fuzz/cluster_file_fuzzer.cc (UBSan): a non-ASCII letter in a bare key made toml++ 3.3 reach
// __builtin_unreachable() (the finding of tests/core/fuzz_regression_test.cc, reached through the
// cluster reader). It reads through detail::parseToml now, so it is a ConfigError. So is the
// input a clean clone's CI found on 2026-12-03
// (fuzz/seeds/cluster_file/quote_after_brace_in_bare_word): U+039F after a quote that `[0000{`
// leaves inside a bare word, which the first guard, a scan for non-ASCII outside strings, took for
// a string.
TEST(ClusterFileFuzzRegression, NonAsciiOutsideStringsIsAConfigError) {
  EXPECT_EQ(clusterError("name = \"x\"\n[[node]]\nn\xc3\xa9 = 1\n"),
            "c.toml:3: Error while parsing key-value pair: expected '=', saw '\xc3\xa9'");
  EXPECT_NE(clusterError("name = \"x\" \xce\xb1\n"), "");
  EXPECT_NE(clusterError("devices = [0000{'0d\xce\x9f' and \"x\"\n"), "");
  // In strings and comments it is text like any other.
  EXPECT_EQ(clusterError("name = \"caf\xc3\xa9\" # \xc3\xa9\n").find("Error"), std::string::npos);
}

// fuzz/plan_json_fuzzer.cc: a number too large for a double ("4E400") made nlohmann throw
// out_of_range (406), which parsePlanJson let escape: only parse_error was translated. Any JSON
// error is a ConfigError naming the file.
TEST(PlanJsonFuzzRegression, NumberOverflowIsAConfigError) {
  for (const char* text : {"4E400", "{\"global_batch\": 1e400, \"replicas\": [], \"ranks\": []}"}) {
    try {
      parsePlanJson(text, "plan.json");
      ADD_FAILURE() << text << " parsed";
    } catch (const ConfigError& error) {
      EXPECT_EQ(error.message().rfind("plan.json: malformed JSON (", 0), 0u) << error.message();
      EXPECT_NE(error.message().find("number overflow"), std::string::npos) << error.message();
    }
  }
}

}  // namespace
}  // namespace chorus::plan
