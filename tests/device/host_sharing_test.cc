// How emulated devices share the host's cores: their turns within a step and their priorities.
#include "chorus/device/host_sharing.h"

#include <gtest/gtest.h>

namespace chorus::device {
namespace {

TEST(HostSharing, SlowerDevicesAskForLowerPriority) {
  EXPECT_EQ(niceFor(1.0), 0);
  EXPECT_EQ(niceFor(0.5), 5);
  EXPECT_EQ(niceFor(0.25), 10);
  EXPECT_EQ(niceFor(0.125), 15);
  EXPECT_EQ(niceFor(0.01), 19);  // the most nice allows
}

TEST(StaggerOffsets, WorkersTakeTurnsOnACore) {
  // cpu@1 has a core; cpu@0.5 another, and cpu@0.25 computes after it, whatever the order and
  // however many cores are idle (computing at once slows both through the shared caches), the
  // core's spare quarter split between the two turns' ends: [0, 0.5) and [0.625, 0.875).
  EXPECT_EQ(staggerOffsets({1.0, 0.5, 0.25}, 3), (std::vector<double>{0, 0, 0.625}));
  EXPECT_EQ(staggerOffsets({1.0, 0.5, 0.25}, 2), (std::vector<double>{0, 0, 0.625}));
  EXPECT_EQ(staggerOffsets({0.25, 1.0, 0.5}, 2), (std::vector<double>{0.625, 0, 0}));
  // Two devices that need 0.6 of a core together take turns on one: [0, 0.522), [0.7225, 0.799).
  const std::vector<double> pair = staggerOffsets({0.522, 0.077}, 2);
  EXPECT_EQ(pair[0], 0);
  EXPECT_NEAR(pair[1], 0.7225, 1e-12);
  // The fullest core that stays at most 0.8 busy takes the third: 0.6 + (1 - 0.75) / 2; 0.3
  // would have made it 0.9, so it got the other core.
  const std::vector<double> thirds = staggerOffsets({0.6, 0.3, 0.15}, 2);
  EXPECT_EQ(thirds[0], 0);
  EXPECT_EQ(thirds[1], 0);
  EXPECT_NEAR(thirds[2], 0.725, 1e-12);
  // Four half-speed workers on two cores: two turns per core, no room to spare.
  EXPECT_EQ(staggerOffsets({0.5, 0.5, 0.5, 0.5}, 2), (std::vector<double>{0, 0, 0.5, 0.5}));
  // No room anywhere: computes at once, as without staggering.
  EXPECT_EQ(staggerOffsets({1.0, 1.0, 0.5}, 2), (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(staggerOffsets({1.0, 1.0, 0.5}, 1), (std::vector<double>{0, 0, 0}));
  // Every turn ends inside its window.
  const std::vector<double> speeds = {0.35, 0.35, 0.35, 0.2, 0.1};
  const std::vector<double> offsets = staggerOffsets(speeds, 2);
  for (size_t i = 0; i < speeds.size(); ++i) EXPECT_LE(offsets[i] + speeds[i], 1 + 1e-12) << i;
}

}  // namespace
}  // namespace chorus::device
