// Private to comm: what a Work handle shares with the Communicator that issued it.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "chorus/comm/comm_stats.h"
#include "chorus/comm/work.h"
#include "chorus/core/clock.h"
#include "shm/progress_board.h"

namespace chorus::comm {

// State of a group that outlives any single operation: names for errors, the progress board,
// the statistics, and whether an earlier failure broke the group. Shared by the Communicator and
// its Work handles (a handle may be waited after the Communicator is gone).
struct GroupContext {
  std::string name;
  std::vector<int> global_ranks;  // member -> global rank
  std::shared_ptr<ProgressBoard> progress;
  std::shared_ptr<CommStats> stats;
  std::atomic<bool> broken{false};
  // Set by Communicator::abort(): waits of the shared-memory transport give up at their next
  // check (within a few ms) with the abort's reason.
  std::atomic<bool> aborted{false};
  std::mutex failure_mutex;
  std::string failure;  // first failure's message, for the errors of later operations

  // Turns a transport exception of operation `op` #`sequence` into a typed chorus error.
  // For point-to-point operations `peer` is the other side (who is "missing" when it fails);
  // for collectives it is -1 and the progress board says who is behind.
  std::exception_ptr translate(const std::exception& error, const std::string& op,
                               long long sequence, std::chrono::milliseconds timeout,
                               int peer = -1);
  void markBroken(const std::string& why);
  std::string describeRanks(const std::vector<int>& group_ranks) const;

  // Gloo sends and receives in flight. A wait on one cannot be cut into slices that look for an
  // abort, as a collective's is (a timed-out wait fails the transfer), so abortTransfers() — which
  // Communicator::abort() calls — aborts them, and their waits return at once. Thread-safe.
  // Tracks `work` when it is a Gloo send or receive (others are ignored); aborts it at once when
  // the group was aborted already.
  void trackTransfer(const c10::intrusive_ptr<c10d::Work>& work);
  void abortTransfers();

 private:
  std::mutex transfers_mutex_;
  std::vector<c10::intrusive_ptr<c10d::Work>> transfers_;  // completed ones pruned as new come
};

struct Work::State {
  std::shared_ptr<GroupContext> group;
  c10::intrusive_ptr<c10d::Work> work;  // null when the operation needed no communication
  std::string operation;
  long long sequence = -1;
  int peer = -1;  // the other side of a send/recv; -1 for collectives
  std::uint64_t bytes = 0;
  std::chrono::milliseconds timeout{0};
  Deadline deadline = Deadline::never();
  Stopwatch clock;
  std::function<void()> finish;  // runs after the transfer: averages, unpacking, local reductions

  std::mutex mutex;
  bool done = false;
  std::exception_ptr error;
};

}  // namespace chorus::comm
