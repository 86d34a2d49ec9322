#include "chorus/core/text.h"

#include <gtest/gtest.h>

#include <vector>

#include "chorus/core/named_catalog.h"

namespace chorus {
namespace {

TEST(Text, FoldsAndComparesAsciiCase) {
  EXPECT_EQ(lowercase("H100-80 GPU"), "h100-80 gpu");
  EXPECT_TRUE(equalsIgnoringCase("NVLink", "nvlink"));
  EXPECT_FALSE(equalsIgnoringCase("nvlink", "nvlink2"));
  EXPECT_TRUE(endsWithIgnoringCase("archive/DATA.PKL", ".pkl"));
  EXPECT_FALSE(endsWithIgnoringCase("pkl", ".pkl"));
}

struct Entry {
  std::string name;
};

TEST(NamedCatalog, FindsEntriesIgnoringCaseAndListsTheirNames) {
  const std::vector<Entry> catalog = {{"V100-16"}, {"pcie4"}};
  EXPECT_EQ(findNamed(catalog, "v100-16"), &catalog[0]);
  EXPECT_EQ(findNamed(catalog, "PCIE4"), &catalog[1]);
  EXPECT_EQ(findNamed(catalog, "pcie"), nullptr);
  EXPECT_EQ(catalogNames(catalog), "V100-16, pcie4");
}

}  // namespace
}  // namespace chorus
