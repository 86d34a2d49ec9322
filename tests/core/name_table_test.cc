#include "chorus/core/name_table.h"

#include <gtest/gtest.h>

namespace chorus {
namespace {

enum class Color { kRed, kGreen, kBlue };

constexpr NamedValue<Color> kColorNames[] = {
    {Color::kRed, "red"}, {Color::kGreen, "green"}, {Color::kBlue, "blue"}};

TEST(NameTable, NamesEachValueAndMarksOneItLacks) {
  EXPECT_STREQ(nameOf(kColorNames, Color::kGreen), "green");
  EXPECT_STREQ(nameOf(kColorNames, static_cast<Color>(7)), "?");
}

TEST(NameTable, ReadsNamesBackCaseSensitively) {
  EXPECT_EQ(valueNamed(kColorNames, "blue"), Color::kBlue);
  EXPECT_EQ(valueNamed(kColorNames, "Blue"), std::nullopt);
  EXPECT_EQ(valueNamed(kColorNames, ""), std::nullopt);
}

TEST(NameTable, ListsTheNamesInOrder) {
  EXPECT_EQ(namesOf(kColorNames), "red, green, blue");
  EXPECT_EQ(namesOf(kColorNames, ", ", " or "), "red, green or blue");
  constexpr NamedValue<Color> kOne[] = {{Color::kRed, "red"}};
  EXPECT_EQ(namesOf(kOne, ", ", " or "), "red");
}

TEST(NameTable, ParsesANameOrSaysWhichAreKnown) {
  EXPECT_EQ(parseNamed(kColorNames, "red", "color"), Color::kRed);
  try {
    parseNamed(kColorNames, "pink", "color");
    FAIL() << "pink parsed";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.message(), "unknown color 'pink' (expected red, green or blue)");
  }
}

}  // namespace
}  // namespace chorus
