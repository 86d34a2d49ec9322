// How emulated devices share the host's cores: their turns within a step and their priorities.
#include "chorus/device/host_sharing.h"

#include <gtest/gtest.h>

#include "chorus/core/error.h"

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

TEST(IntraOpThreads, ACpuBesideAGpuTakesTheCoresTheGpuWorkerLeaves) {
  // cuda:0,cpu on 16 cores: the GPU's worker keeps one core, the CPU gets the other 15.
  EXPECT_EQ(intraOpThreads({false, true}, {1.0, 1.0}, 16, 0), (std::vector<int>{1, 15}));
  // CPUs at full speed share what is left evenly, the first ones the remainder: every core busy.
  EXPECT_EQ(intraOpThreads({false, true, true}, {1.0, 1.0, 1.0}, 16, 0),
            (std::vector<int>{1, 8, 7}));
  EXPECT_EQ(intraOpThreads({true, true}, {1.0, 1.0}, 5, 0), (std::vector<int>{3, 2}));
  EXPECT_EQ(intraOpThreads({true, true, true}, {1.0, 1.0, 1.0}, 5, 0), (std::vector<int>{2, 2, 1}));
  // A job of one CPU has the node: PyTorch's default, every core.
  EXPECT_EQ(intraOpThreads({true}, {1.0}, 2, 0), (std::vector<int>{2}));
}

TEST(IntraOpThreads, EmulatedDevicesAndFullNodesKeepOneThread) {
  // An emulated CPU's speed is taken from its one thread's CPU time: it never gets more, and
  // beside it cpu@1.0 is a device of one core, the unit of the emulated speeds.
  EXPECT_EQ(intraOpThreads({true, true}, {1.0, 0.5}, 16, 0), (std::vector<int>{1, 1}));
  EXPECT_EQ(intraOpThreads({false, true}, {1.0, 0.5}, 16, 0), (std::vector<int>{1, 1}));
  EXPECT_EQ(intraOpThreads({true, true}, {0.5, 0.01}, 16, 0), (std::vector<int>{1, 1}));
  // No core left over: one each.
  EXPECT_EQ(intraOpThreads({true, true}, {1.0, 1.0}, 2, 0), (std::vector<int>{1, 1}));
  EXPECT_EQ(intraOpThreads({true, true, true}, {1.0, 1.0, 1.0}, 2, 0), (std::vector<int>{1, 1, 1}));
  // GPU workers keep one whatever is asked.
  EXPECT_EQ(intraOpThreads({false, false}, {1.0, 0.4}, 16, 4), (std::vector<int>{1, 1}));
}

TEST(IntraOpThreads, ARequestedCountIsWhatEveryFullSpeedCpuGets) {
  EXPECT_EQ(intraOpThreads({false, true, true}, {1.0, 1.0, 0.5}, 16, 4),
            (std::vector<int>{1, 4, 1}));
  EXPECT_EQ(intraOpThreads({false, true}, {0.5, 1.0}, 16, 0), (std::vector<int>{1, 15}));
  // The user may oversubscribe: what is asked is what runs.
  EXPECT_EQ(intraOpThreads({true, true}, {1.0, 1.0}, 2, 3), (std::vector<int>{3, 3}));
  EXPECT_THROW(intraOpThreads({true}, {1.0}, 2, -1), ConfigError);
  EXPECT_THROW(intraOpThreads({true, false}, {1.0}, 2, 0), ConfigError);
}

}  // namespace
}  // namespace chorus::device
