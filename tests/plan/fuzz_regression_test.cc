// Inputs that the fuzz targets of fuzz/ found to break a plan-layer parser, each pinned down as
// the behaviour it must have now (docs/security.md, "Fuzzing": the findings and their fixes).
#include <gtest/gtest.h>

#include <string>

#include "chorus/core/error.h"
#include "chorus/plan/cluster_file.h"

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
// cluster reader, which calls toml::parse itself). It is a ConfigError before toml++ runs.
TEST(ClusterFileFuzzRegression, NonAsciiOutsideStringsIsAConfigError) {
  EXPECT_EQ(clusterError("name = \"x\"\n[[node]]\nn\xc3\xa9 = 1\n"),
            "c.toml:3:2: non-ASCII text outside a string or comment (TOML keys and values other "
            "than strings are ASCII; quote it)");
  EXPECT_NE(clusterError("name = \"x\" \xce\xb1\n"), "");
  // In strings and comments it is text like any other.
  EXPECT_EQ(clusterError("name = \"caf\xc3\xa9\" # \xc3\xa9\n").find("non-ASCII"),
            std::string::npos);
}

}  // namespace
}  // namespace chorus::plan
