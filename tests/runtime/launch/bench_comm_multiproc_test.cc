// `chorus bench comm` end to end: real worker processes started by its own agent. All-reduce
// yields one row per algorithm, codec and size, every row checked (#wrong 0: exact for `none`,
// within the codec's documented bound for the lossy ones), and bad combinations are usage errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>

#include "runtime/chorus_cli.h"

namespace {

using chorus::testing::runCommand;

// The JSON list rank 0 printed (log lines may surround it).
nlohmann::json rowsOf(const std::string& output) {
  const size_t first = output.find("[\n");
  const size_t last = output.rfind(']');
  if (first == std::string::npos || last == std::string::npos || last < first) return {};
  return nlohmann::json::parse(output.substr(first, last - first + 1));
}

std::string benchComm(const std::string& args) {
  return std::string(CHORUS_BINARY) + " --log-level warn bench comm -w 1 -n 2 " + args;
}

TEST(BenchCommMultiproc, AllReduceRowsForEveryAlgorithmAndCodec) {
  const auto run = runCommand(benchComm(
      "--ranks 3 --group-size 2 --transports gloo --ops all_reduce,broadcast -b 16K -e 64K -f 4 "
      "--algorithms flat,hierarchical,2d --codecs none,fp16,bf16,int8,topk,powersgd --json"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const nlohmann::json rows = rowsOf(run.output);
  ASSERT_TRUE(rows.is_array()) << run.output;
  std::multiset<std::pair<std::string, std::string>> variants;
  int broadcasts = 0;
  for (const auto& row : rows) {
    for (const char* field :
         {"op", "size", "time_s", "algbw", "busbw", "wrong", "backend", "algorithm", "codec"})
      ASSERT_TRUE(row.contains(field)) << field << " missing in " << row.dump();
    EXPECT_EQ(row["wrong"].get<long long>(), 0) << row.dump();
    EXPECT_EQ(row["backend"], "gloo");
    EXPECT_GT(row["time_s"].get<double>(), 0.0);
    const auto size = row["size"].get<long long>();
    EXPECT_TRUE(size == 16384 || size == 65536) << row.dump();
    EXPECT_NEAR(row["algbw"].get<double>(), size / row["time_s"].get<double>() / 1e9,
                1e-6 * row["algbw"].get<double>());
    if (row["op"] == "broadcast") {
      ++broadcasts;
      EXPECT_EQ(row["codec"], "none");
      continue;
    }
    ASSERT_EQ(row["op"], "all_reduce");
    EXPECT_NEAR(row["busbw"].get<double>(), row["algbw"].get<double>() * 4.0 / 3.0,
                1e-9 + 1e-6 * row["busbw"].get<double>());
    variants.insert({row["algorithm"].get<std::string>(), row["codec"].get<std::string>()});
  }
  EXPECT_EQ(broadcasts, 2);
  // Two sizes of every variant; 2-D has no lossy codec (codecs compress the leaders' all-reduce).
  std::multiset<std::pair<std::string, std::string>> expected;
  for (const char* algorithm : {"flat", "hierarchical", "2d"})
    for (const char* codec : {"none", "fp16", "bf16", "int8", "topk", "powersgd"})
      if (std::string(algorithm) != "2d" || std::string(codec) == "none")
        for (int size = 0; size < 2; ++size) expected.insert({algorithm, codec});
  EXPECT_EQ(variants, expected);
}

TEST(BenchCommMultiproc, UnusableCodecsAndAlgorithmsAreUsageErrors) {
  for (const char* args :
       {"--codecs fp16 -d float64", "--codecs int8 -o max", "--codecs gzip", "--algorithms ring"}) {
    const auto run = runCommand(benchComm(std::string("--ops all_reduce ") + args));
    EXPECT_EQ(run.exit_code, 2) << args << "\n" << run.output;
    EXPECT_NE(run.output.find("bench comm"), std::string::npos) << run.output;
  }
}

}  // namespace
