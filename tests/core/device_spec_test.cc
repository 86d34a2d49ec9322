#include "chorus/core/device_spec.h"

#include <gtest/gtest.h>

#include "chorus/core/error.h"

namespace chorus {
namespace {

TEST(DeviceSpec, ParsesPlainCpu) {
  const DeviceSpec spec = parseDeviceSpec("cpu");
  EXPECT_EQ(spec.kind, DeviceKind::kCpu);
  EXPECT_EQ(spec.index, -1);
  EXPECT_EQ(spec.speed, 1.0);
  EXPECT_FALSE(spec.memory_budget.has_value());
  EXPECT_FALSE(spec.emulated());
}

TEST(DeviceSpec, ParsesEmulatedSpeedAndBudget) {
  const DeviceSpec spec = parseDeviceSpec("cpu@0.5/512MiB");
  EXPECT_EQ(spec.kind, DeviceKind::kCpu);
  EXPECT_EQ(spec.speed, 0.5);
  ASSERT_TRUE(spec.memory_budget.has_value());
  EXPECT_EQ(*spec.memory_budget, 512ull << 20);
  EXPECT_TRUE(spec.emulated());
}

TEST(DeviceSpec, ParsesCudaWithIndexAndBudget) {
  const DeviceSpec spec = parseDeviceSpec("cuda:1/20GiB");
  EXPECT_EQ(spec.kind, DeviceKind::kCuda);
  EXPECT_EQ(spec.index, 1);
  EXPECT_EQ(*spec.memory_budget, 20ull << 30);
}

TEST(DeviceSpec, ParsesListWithSpaces) {
  const auto specs = parseDeviceSpecs("cpu@1.0, cpu@0.5 ,cuda:0");
  ASSERT_EQ(specs.size(), 3u);
  EXPECT_EQ(specs[1].speed, 0.5);
  EXPECT_EQ(specs[2].kind, DeviceKind::kCuda);
}

TEST(DeviceSpec, AutoStandsAlone) {
  EXPECT_EQ(parseDeviceSpecs("auto")[0].kind, DeviceKind::kAuto);
  EXPECT_THROW(parseDeviceSpecs("auto,cpu"), ConfigError);
  EXPECT_THROW(parseDeviceSpec("auto@0.5"), ConfigError);
}

TEST(DeviceSpec, RoundTripsThroughCanonicalText) {
  for (const char* text :
       {"cpu", "cpu@0.5", "cpu@0.25/512M", "cuda:3/20G", "cuda:0@0.333", "auto"}) {
    const DeviceSpec spec = parseDeviceSpec(text);
    EXPECT_EQ(parseDeviceSpec(spec.toString()), spec) << text << " -> " << spec.toString();
  }
  EXPECT_EQ(parseDeviceSpec("cpu@0.5/512MiB").toString(), "cpu@0.5/512M");
}

TEST(DeviceSpec, MalformedSpecErrorQuotesItAndSaysWhatIsExpected) {
  for (const char* text : {"gpu", "cuda", "cuda:x", "cpu@0", "cpu@1.5", "cpu@fast", "cpu/lots",
                           "cpu/0", "", "cpu,", ",cpu", "cpu@0.5/512XB"}) {
    try {
      parseDeviceSpecs(text);
      ADD_FAILURE() << "no error for '" << text << "'";
    } catch (const ConfigError& error) {
      const std::string message = error.message();
      EXPECT_NE(message.find("expected"), std::string::npos) << message;
      if (*text) {
        EXPECT_NE(message.find('\'' + std::string(text).substr(0, 3)), std::string::npos)
            << message;
      }
    }
  }
}

}  // namespace
}  // namespace chorus
