#include "chorus/core/config.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "chorus/core/error.h"

namespace chorus {
namespace {

constexpr const char* kJob = R"(# a job
name = "fmnist"
steps = 100
seed = 7
verbose = true

[optimizer]
lr = 0.05
momentum = 0.9
milestones = [30, 60]

[data]
path = "/data"
weights = [1, 0.5]
files = ["a", "b"]
loader.workers = 2
)";

// Runs `body` and returns the ConfigError's message (failing the test when nothing is thrown).
template <typename Body>
std::string errorOf(Body body) {
  try {
    body();
  } catch (const ConfigError& error) {
    return error.message();
  }
  ADD_FAILURE() << "expected a ConfigError";
  return "";
}

TEST(Config, ReadsEveryTypeFromNestedTablesAndDottedKeys) {
  const Config config = Config::parseString(kJob, "job.toml");
  EXPECT_EQ(config.getString("name", ""), "fmnist");
  EXPECT_EQ(config.getInt("steps", 0), 100);
  EXPECT_TRUE(config.getBool("verbose", false));
  EXPECT_EQ(config.getDouble("optimizer.lr", 0), 0.05);
  EXPECT_EQ(config.getDouble("seed", 0), 7.0);  // an integer where a number is expected
  EXPECT_EQ(config.getInts("optimizer.milestones", {}), (std::vector<int64_t>{30, 60}));
  EXPECT_EQ(config.getDoubles("data.weights", {}), (std::vector<double>{1.0, 0.5}));
  EXPECT_EQ(config.getStrings("data.files", {}), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(config.getInt("data.loader.workers", 0), 2);
  EXPECT_EQ(config.source(), "job.toml");
  EXPECT_TRUE(config.has("optimizer"));
  EXPECT_TRUE(config.has("data.loader.workers"));
  EXPECT_FALSE(config.has("data.loader.threads"));
  EXPECT_FALSE(config.has("name.sub"));
}

TEST(Config, AbsentKeysGiveTheirFallbacks) {
  const Config config = Config::parseString(kJob);
  EXPECT_EQ(config.getDouble("optimizer.weight_decay", 0.25), 0.25);
  EXPECT_EQ(config.getInt("missing", -3), -3);
  EXPECT_FALSE(config.getBool("missing.flag", false));
  EXPECT_EQ(config.getString("x.y.z", "dflt"), "dflt");
  EXPECT_EQ(config.getInts("no", {1, 2}), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(config.getDoubles("no", {0.5}), (std::vector<double>{0.5}));
  EXPECT_EQ(config.getStrings("no", {"q"}), (std::vector<std::string>{"q"}));
  const Config empty;
  EXPECT_EQ(empty.getInt("steps", 9), 9);
  EXPECT_NO_THROW(empty.rejectUnknownKeys());
}

TEST(Config, SetCreatesTablesAndOverridesFileValues) {
  Config config = Config::parseString(kJob, "job.toml");
  config.set("optimizer.lr=0.5");
  config.set("trainer.precision.kind = \"bf16\"");
  config.set("steps=250");
  config.set("verbose=false");
  config.set("optimizer.milestones=[10, 20, 30]");
  EXPECT_EQ(config.getDouble("optimizer.lr", 0), 0.5);
  EXPECT_EQ(config.getDouble("optimizer.momentum", 0), 0.9);  // siblings survive
  EXPECT_EQ(config.getString("trainer.precision.kind", ""), "bf16");
  EXPECT_EQ(config.getInt("steps", 0), 250);
  EXPECT_FALSE(config.getBool("verbose", true));
  EXPECT_EQ(config.getInts("optimizer.milestones", {}), (std::vector<int64_t>{10, 20, 30}));
}

TEST(Config, SetKeepsValuesThatAreNotTomlAsBareStrings) {
  Config config;
  config.set("devices=cpu@1.0,cpu@0.5");
  config.set("name=hello world");
  config.set("empty=");
  config.set("tricky=1\nsteps = 5");  // must not smuggle in a second key
  config.set("expr=a=b");             // only the first '=' separates key and value
  EXPECT_EQ(config.getString("devices", ""), "cpu@1.0,cpu@0.5");
  EXPECT_EQ(config.getString("name", ""), "hello world");
  EXPECT_EQ(config.getString("empty", "x"), "");
  EXPECT_EQ(config.getString("tricky", ""), "1\nsteps = 5");
  EXPECT_FALSE(config.has("steps"));
  EXPECT_EQ(config.getString("expr", ""), "a=b");
}

TEST(Config, SetRejectsMalformedAssignments) {
  Config config = Config::parseString(kJob);
  EXPECT_NE(errorOf([&] { config.set("optimizer.lr"); }).find("expected KEY=VALUE"),
            std::string::npos);
  EXPECT_THROW(config.set("=5"), ConfigError);
  EXPECT_THROW(config.set("a..b=5"), ConfigError);
  const std::string message = errorOf([&] { config.set("steps.max=5"); });
  EXPECT_NE(message.find("'steps' is an integer, not a table"), std::string::npos) << message;
}

TEST(Config, WrongTypeNamesKeyFileAndLine) {
  const Config config = Config::parseString(kJob, "job.toml");
  EXPECT_EQ(errorOf([&] { config.getDouble("name", 0); }),
            "config key 'name' (job.toml line 2): expected a number, got a string");
  EXPECT_EQ(errorOf([&] { config.getInt("optimizer.lr", 0); }),
            "config key 'optimizer.lr' (job.toml line 8): expected an integer, got a float");
  EXPECT_EQ(errorOf([&] { config.getBool("steps", false); }),
            "config key 'steps' (job.toml line 3): expected a boolean, got an integer");
  EXPECT_EQ(errorOf([&] { config.getString("optimizer", ""); }),
            "config key 'optimizer' (job.toml line 7): expected a string, got a table");
  EXPECT_EQ(errorOf([&] { config.getInts("data.weights", {}); }),
            "config key 'data.weights' (job.toml line 14): expected an array of integers, got an "
            "array whose element 1 is a float");
  EXPECT_EQ(errorOf([&] { config.getStrings("name", {}); }),
            "config key 'name' (job.toml line 2): expected an array of strings, got a string");
  EXPECT_THROW(config.getDoubles("data.files", {}), ConfigError);
}

TEST(Config, WrongTypeFromSetSaysSo) {
  Config config = Config::parseString(kJob, "job.toml");
  config.set("optimizer.lr=fast");
  EXPECT_EQ(errorOf([&] { config.getDouble("optimizer.lr", 0); }),
            "config key 'optimizer.lr' (--set): expected a number, got a string");
}

TEST(Config, UnknownKeysAreListedWithLinesAndSuggestions) {
  Config config = Config::parseString(R"(steps = 10
[optimizer]
lrr = 0.1
momentum = 0.9
[extra]
thing = 1
)",
                                      "job.toml");
  config.set("optimizer.momentun=0.5");
  config.getInt("steps", 0);
  config.getDouble("optimizer.lr", 0.01);
  config.getDouble("optimizer.momentum", 0);
  const std::string message = errorOf([&] { config.rejectUnknownKeys(); });
  EXPECT_EQ(message,
            "unknown config keys: 'optimizer.lrr' (job.toml line 3; did you mean 'optimizer.lr'?), "
            "'extra.thing' (job.toml line 6), 'optimizer.momentun' (--set; did you mean "
            "'optimizer.momentum'?)");
}

TEST(Config, AllowedTablesAndReadKeysAreNotUnknown) {
  const Config config = Config::parseString(kJob, "job.toml");
  config.getString("name", "");
  config.getInt("steps", 0);
  config.getInt("seed", 0);
  config.getBool("verbose", false);
  config.allowTable("optimizer");
  config.allowTable("data");
  EXPECT_NO_THROW(config.rejectUnknownKeys());

  // "data" allows "data.x" but not "database.x".
  Config other = Config::parseString("[database]\nx = 1\n", "db.toml");
  other.allowTable("data");
  EXPECT_EQ(errorOf([&] { other.rejectUnknownKeys(); }),
            "unknown config key: 'database.x' (db.toml line 2)");
}

TEST(Config, CopiesAreIndependent) {
  Config original = Config::parseString("a = 1\nb = 2\n");
  original.getInt("a", 0);
  Config copy = original;
  copy.set("a=5");
  copy.getInt("b", 0);
  EXPECT_EQ(original.getInt("a", 0), 1);
  EXPECT_EQ(copy.getInt("a", 0), 5);
  EXPECT_THROW(original.rejectUnknownKeys(), ConfigError);  // b was read only through the copy
  EXPECT_NO_THROW(copy.rejectUnknownKeys());
  Config moved = std::move(copy);
  EXPECT_EQ(moved.getInt("a", 0), 5);
}

TEST(Config, SyntaxErrorGivesFileLineAndColumn) {
  const std::string message = errorOf([] { Config::parseString("a = 1\nb = = 2\n", "bad.toml"); });
  EXPECT_EQ(message.rfind("bad.toml:2:", 0), 0u) << message;
  EXPECT_GT(message.size(), std::string("bad.toml:2:5: ").size()) << message;
}

TEST(Config, ParseFileReadsAFileAndNamesAMissingOne) {
  const std::string path = ::testing::TempDir() + "chorus_config_test.toml";
  {
    std::ofstream out(path);
    out << "steps = 3\n[x]\ny = \"z\"\n";
  }
  const Config config = Config::parseFile(path);
  EXPECT_EQ(config.getInt("steps", 0), 3);
  EXPECT_EQ(config.getString("x.y", ""), "z");
  EXPECT_EQ(config.source(), path);
  std::remove(path.c_str());

  const std::string missing = ::testing::TempDir() + "no_such_chorus_config.toml";
  const std::string message = errorOf([&] { Config::parseFile(missing); });
  EXPECT_NE(message.find(missing), std::string::npos) << message;
}

TEST(Config, ToTomlRoundTripsToEqualReads) {
  Config config = Config::parseString(kJob, "job.toml");
  config.set("optimizer.lr=0.1");
  config.set("devices=cpu@1.0,cpu@0.5");
  config.set("trainer.scale=0.30000000000000004");
  const Config back = Config::parseString(config.toToml(), "round-trip");
  EXPECT_EQ(back.getString("name", ""), "fmnist");
  EXPECT_EQ(back.getInt("steps", 0), 100);
  EXPECT_TRUE(back.getBool("verbose", false));
  EXPECT_EQ(back.getDouble("optimizer.lr", 0), 0.1);
  EXPECT_EQ(back.getDouble("optimizer.momentum", 0), 0.9);
  EXPECT_EQ(back.getDouble("trainer.scale", 0), 0.30000000000000004);
  EXPECT_EQ(back.getInts("optimizer.milestones", {}), (std::vector<int64_t>{30, 60}));
  EXPECT_EQ(back.getDoubles("data.weights", {}), (std::vector<double>{1.0, 0.5}));
  EXPECT_EQ(back.getStrings("data.files", {}), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(back.getInt("data.loader.workers", 0), 2);
  EXPECT_EQ(back.getString("devices", ""), "cpu@1.0,cpu@0.5");
  // Canonical: printing the parsed text again gives the same text.
  EXPECT_EQ(back.toToml(), config.toToml());
}

}  // namespace
}  // namespace chorus
