#include "chorus/core/config_section.h"

#include <gtest/gtest.h>

#include "chorus/core/error.h"

namespace chorus {
namespace {

struct Section {
  std::int64_t steps = 1;
  double lr = 0.5;
  bool verbose = false;
  std::string name = "default";
  std::vector<std::int64_t> shape = {1, 2};
  std::vector<double> weights;
  std::vector<std::string> files = {"x"};
};

TEST(ConfigSection, ReadsEachFieldByItsTypeAndKeepsTheDefaultsOfAbsentKeys) {
  const Config config = Config::parseString(
      "[job]\nsteps = 3\nlr = 2\nverbose = true\nweights = [0.5]\nfiles = [\"a\", \"b\"]\n");
  Section section;
  readSection(config, "job",
              {{"steps", section.steps},
               {"lr", section.lr},
               {"verbose", section.verbose},
               {"name", section.name},
               {"shape", section.shape},
               {"weights", section.weights},
               {"files", section.files}});
  EXPECT_EQ(section.steps, 3);
  EXPECT_EQ(section.lr, 2.0);
  EXPECT_TRUE(section.verbose);
  EXPECT_EQ(section.name, "default");
  EXPECT_EQ(section.shape, (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(section.weights, std::vector<double>{0.5});
  EXPECT_EQ(section.files, (std::vector<std::string>{"a", "b"}));
  EXPECT_NO_THROW(config.rejectUnknownKeys());
}

TEST(ConfigSection, NamesTheFirstKeyOfTheWrongType) {
  const Config config = Config::parseString("[job]\nsteps = \"many\"\nlr = \"high\"\n", "job.toml");
  Section section;
  try {
    readSection(config, "job", {{"steps", section.steps}, {"lr", section.lr}});
    FAIL() << "read a string as an integer";
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.message(),
              "config key 'job.steps' (job.toml line 2): expected an integer, got a string");
  }
}

}  // namespace
}  // namespace chorus
