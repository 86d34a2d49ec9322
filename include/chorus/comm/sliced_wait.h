// Waiting on a transfer that cannot be interrupted, in slices, so that an abort of its group ends
// the wait at the next slice. Used by Work (src/comm/work.cc) for Gloo collectives; a template
// over the transfer so that its one race can be tested without a network.
#pragma once

#include <algorithm>
#include <chrono>
#include <optional>

#include "chorus/core/clock.h"

namespace chorus::comm {

// Waits for `transfer` (a c10d::Work, or anything with `bool wait(Millis)`, which throws when the
// time runs out first or the transfer failed, and `bool isCompleted()`) until `deadline`, in
// slices of at most `slice`, asking `aborted()` after each slice that ends before the transfer.
// Returns the transfer's own result, rethrows its own failure, rethrows the slice's timeout once
// the deadline has passed, and returns std::nullopt where `aborted()` held.
//
// A slice's timeout and the transfer's completion race: c10d's Work::wait throws "Operation timed
// out!" when its wait ends before the work, and the work may complete before the caller looks at
// it. Such a transfer is done, not failed: its own result is taken on the next turn. (Before this,
// a Gloo collective that finished in that instant failed within seconds of a 60 s deadline.)
template <typename Transfer, typename Aborted>
std::optional<bool> waitInSlices(Transfer& transfer, const Deadline& deadline, Millis slice,
                                 const Aborted& aborted) {
  for (;;) {
    // Completed: its own result at once (a wait without timeout returns or rethrows).
    if (transfer.isCompleted()) return transfer.wait(Millis(0));
    const Millis now_slice = std::min(slice, std::max(deadline.remaining(), Millis(1)));
    try {
      return transfer.wait(now_slice);
    } catch (...) {
      if (!transfer.isCompleted() && deadline.expired()) throw;
    }
    if (!transfer.isCompleted() && aborted()) return std::nullopt;
  }
}

}  // namespace chorus::comm
