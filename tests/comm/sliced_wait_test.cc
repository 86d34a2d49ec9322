// waitInSlices: how Work waits on a Gloo collective, with transfers whose wait never sleeps, so
// each race is taken on purpose rather than by luck.
#include "chorus/comm/sliced_wait.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace chorus::comm {
namespace {

// A transfer that stays pending for `slices` waits, each of which times out as c10d's
// Work::wait does. With `completes_late`, it completes in the instant after the slice's
// timeout, before the caller looks at it: the race c10d leaves to its callers.
struct ScriptedTransfer {
  int slices = 0;
  bool completes_late = false;
  bool fails = false;
  bool completed = false;
  int waits = 0;

  bool wait(Millis timeout) {
    ++waits;
    if (completed) {
      if (fails) throw std::runtime_error("Connection reset by peer");
      return true;
    }
    if (slices-- <= 0) {
      if (!completes_late) {
        completed = true;
        return wait(timeout);
      }
      completed = true;  // ... just after the slice gave up
    }
    throw std::runtime_error("Operation timed out!");
  }
  bool isCompleted() const { return completed; }
};

ScriptedTransfer pendingFor(int slices, bool completes_late = false, bool fails = false) {
  ScriptedTransfer transfer;
  transfer.slices = slices;
  transfer.completes_late = completes_late;
  transfer.fails = fails;
  return transfer;
}

const auto kNeverAborted = [] { return false; };

TEST(SlicedWait, ATransferThatCompletesAsItsSliceEndsIsDoneNotTimedOut) {
  ScriptedTransfer transfer = pendingFor(3, true);
  EXPECT_EQ(waitInSlices(transfer, Deadline::never(), Millis(50), kNeverAborted),
            std::optional<bool>(true));
  EXPECT_EQ(transfer.waits, 5);  // three pending slices, the late one, and its result
}

TEST(SlicedWait, ATransferThatFailsAsItsSliceEndsRethrowsItsOwnError) {
  ScriptedTransfer transfer = pendingFor(2, true, true);
  EXPECT_THROW(
      {
        try {
          waitInSlices(transfer, Deadline::never(), Millis(50), kNeverAborted);
        } catch (const std::runtime_error& error) {
          EXPECT_STREQ(error.what(), "Connection reset by peer");
          throw;
        }
      },
      std::runtime_error);
}

TEST(SlicedWait, APendingTransferTimesOutAtTheDeadlineOnly) {
  ScriptedTransfer transfer = pendingFor(1000000);
  EXPECT_THROW(
      {
        try {
          waitInSlices(transfer, Deadline::after(Millis(0)), Millis(50), kNeverAborted);
        } catch (const std::runtime_error& error) {
          EXPECT_STREQ(error.what(), "Operation timed out!");
          throw;
        }
      },
      std::runtime_error);
  EXPECT_EQ(transfer.waits, 1);
}

TEST(SlicedWait, AnAbortEndsTheWaitAfterTheSlice) {
  ScriptedTransfer transfer = pendingFor(1000000);
  int asked = 0;
  EXPECT_EQ(waitInSlices(transfer, Deadline::never(), Millis(50), [&] { return ++asked == 3; }),
            std::nullopt);
  EXPECT_EQ(transfer.waits, 3);
}

TEST(SlicedWait, ACompletedTransferIsNotAbortedEvenWhenItsGroupIs) {
  ScriptedTransfer transfer = pendingFor(0, true);
  EXPECT_EQ(waitInSlices(transfer, Deadline::never(), Millis(50), [] { return true; }),
            std::optional<bool>(true));
}

}  // namespace
}  // namespace chorus::comm
