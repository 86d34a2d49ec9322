#include "chorus/core/units.h"

#include <gtest/gtest.h>

#include "chorus/core/error.h"

namespace chorus {
namespace {

TEST(Units, ParsesBinaryDecimalAndShortUnits) {
  EXPECT_EQ(parseBytes("4096"), 4096u);
  EXPECT_EQ(parseBytes("12B"), 12u);
  EXPECT_EQ(parseBytes("1K"), 1024u);
  EXPECT_EQ(parseBytes("1KiB"), 1024u);
  EXPECT_EQ(parseBytes("1KB"), 1000u);
  EXPECT_EQ(parseBytes("512MiB"), 512ull << 20);
  EXPECT_EQ(parseBytes("256M"), 256ull << 20);
  EXPECT_EQ(parseBytes("1.5GiB"), 3ull << 29);
  EXPECT_EQ(parseBytes("2GB"), 2000000000u);
}

TEST(Units, RejectsGarbage) {
  for (const char* text : {"", "MiB", "-1", "1 MiB", "1XB", "1..2K", "1e3"})
    EXPECT_THROW(parseBytes(text), ConfigError) << text;
}

TEST(Units, FormatsForPeopleAndTables) {
  EXPECT_EQ(formatBytes(12), "12 B");
  EXPECT_EQ(formatBytes(1536), "1.5 KiB");
  EXPECT_EQ(formatBytes(512ull << 20), "512 MiB");
  EXPECT_EQ(formatBytesShort(1024), "1K");
  EXPECT_EQ(formatBytesShort(256ull << 20), "256M");
  EXPECT_EQ(formatBytesShort(1000), "1000");
}

}  // namespace
}  // namespace chorus
