#include "chorus/core/collective_kinds.h"

#include <gtest/gtest.h>

#include "chorus/core/error.h"

namespace chorus {
namespace {

// The job's comm.algorithm and comm.compression spellings read back to the value they name.
TEST(CollectiveKinds, EveryNameReadsBackToItsValue) {
  for (auto algorithm : {AllReduceAlgorithm::kAuto, AllReduceAlgorithm::kFlat,
                         AllReduceAlgorithm::kHierarchical, AllReduceAlgorithm::kTwoD})
    EXPECT_EQ(parseAllReduceAlgorithm(toString(algorithm)), algorithm) << toString(algorithm);
  for (auto codec : {CodecKind::kNone, CodecKind::kFp16, CodecKind::kBf16, CodecKind::kInt8,
                     CodecKind::kTopK, CodecKind::kPowerSgd})
    EXPECT_EQ(parseCodecKind(toString(codec)), codec) << toString(codec);
  EXPECT_STREQ(toString(AllReduceAlgorithm::kTwoD), "2d");
  EXPECT_STREQ(toString(CodecKind::kPowerSgd), "powersgd");
}

TEST(CollectiveKinds, AnUnknownNameListsTheKnownOnes) {
  try {
    parseAllReduceAlgorithm("ring");  // the plan's spelling of kFlat, not the job's
    FAIL() << "ring parsed";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.message(),
              "unknown all-reduce algorithm 'ring' (expected auto, flat, hierarchical or 2d)");
  }
  EXPECT_THROW(parseCodecKind("zip"), ConfigError);
}

}  // namespace
}  // namespace chorus
