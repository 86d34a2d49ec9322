#include "chorus/comm/work.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "chorus/comm/sliced_wait.h"
#include "chorus/core/error.h"
#include "chorus/core/text.h"
#include "work_state.h"

namespace chorus::comm {
namespace {

// Extra time granted to the c10d wait beyond the operation's deadline, so the transport's own
// timeout (set to the same deadline) normally fires first with the more specific message.
constexpr std::chrono::milliseconds kWaitGrace{1000};

bool mentions(const std::string& text, std::initializer_list<const char*> needles) {
  const std::string lower = lowercase(text);
  for (const char* needle : needles)
    if (lower.find(needle) != std::string::npos) return true;
  return false;
}

std::string shorten(const std::string& text) {
  constexpr size_t kMax = 300;
  return text.size() <= kMax ? text : text.substr(0, kMax) + "...";
}

// A failed operation's transfer may still be pending (a recv whose sender never came): abort it
// where the backend can, so it cannot write into the caller's tensor later. Backends without
// abort (Gloo collectives) end the transfer themselves at their own deadline.
void abandon(Work::State& state) {
  if (!state.work || state.work->isCompleted()) return;
  try {
    state.work->abort();
  } catch (const std::exception&) {
  }
}

// How often a wait on a Gloo collective looks whether its group was aborted.
constexpr std::chrono::milliseconds kAbortCheck{50};

// Waits up to `budget` for `state`'s transfer. A Gloo collective cannot be interrupted, so it is
// waited in slices of kAbortCheck (waitInSlices), and an abort() of the group (elastic recovery,
// when the heartbeat declares a peer lost) ends the wait at the next slice rather than at the
// collective's deadline; the collective itself runs on in its process group (~Backends). Other
// transfers are waited at once: the shared-memory transport watches the abort itself, and a
// timed-out wait on a Gloo send or receive (or NCCL) would fail the transfer. Returns false when
// the work reports it was aborted.
bool waitForTransfer(Work::State& state, std::chrono::milliseconds budget) {
  auto* collective = dynamic_cast<c10d::ProcessGroupGloo::AsyncWork*>(state.work.get());
  if (collective == nullptr) return state.work->wait(budget);
  const Deadline deadline =
      budget >= std::chrono::hours(24 * 365) ? Deadline::never() : Deadline::after(budget);
  const std::optional<bool> done =
      waitInSlices(*collective, deadline, kAbortCheck, [&] { return state.group->aborted.load(); });
  if (done.has_value()) return *done;
  std::lock_guard<std::mutex> lock(state.group->failure_mutex);
  CHORUS_THROW(CommError, state.operation, " #", state.sequence, " in group '", state.group->name,
               "' was given up: ", state.group->failure);
}

}  // namespace

std::string GroupContext::describeRanks(const std::vector<int>& group_ranks) const {
  std::vector<int> global;
  for (int rank : group_ranks)
    global.push_back(global_ranks.empty() ? rank : global_ranks.at(rank));
  return joinInts(global);
}

void GroupContext::trackTransfer(const c10::intrusive_ptr<c10d::Work>& work) {
  if (!work || (dynamic_cast<c10d::ProcessGroupGloo::SendWork*>(work.get()) == nullptr &&
                dynamic_cast<c10d::ProcessGroupGloo::RecvWork*>(work.get()) == nullptr))
    return;
  {
    std::lock_guard<std::mutex> lock(transfers_mutex_);
    std::erase_if(transfers_, [](const auto& transfer) { return transfer->isCompleted(); });
    transfers_.push_back(work);
  }
  // An abort between the transfer's start and its tracking would miss it.
  if (aborted.load()) abortTransfers();
}

void GroupContext::abortTransfers() {
  std::vector<c10::intrusive_ptr<c10d::Work>> pending;
  {
    std::lock_guard<std::mutex> lock(transfers_mutex_);
    pending.swap(transfers_);
  }
  for (const auto& transfer : pending) {
    if (transfer->isCompleted()) continue;
    try {
      transfer->abort();
    } catch (const std::exception&) {
      // Gone already: nothing waits on it any more.
    }
  }
}

void GroupContext::markBroken(const std::string& why) {
  std::lock_guard<std::mutex> lock(failure_mutex);
  if (!broken.exchange(true)) failure = why;
}

std::exception_ptr GroupContext::translate(const std::exception& error, const std::string& op,
                                           long long sequence, std::chrono::milliseconds timeout,
                                           int peer) {
  const std::string what = error.what();
  std::vector<int> missing;
  if (peer >= 0)
    missing.push_back(peer);
  else if (progress)
    missing = progress->behind(sequence);
  const std::string where = detail::concat(op, " #", sequence, " in group '", name, "'");
  const std::string absent = missing.empty() ? std::string("no rank is behind (all had entered it)")
                                             : "ranks not arrived: " + describeRanks(missing);
  std::vector<int> global_missing;
  for (int rank : missing)
    global_missing.push_back(global_ranks.empty() ? rank : global_ranks[rank]);
  try {
    if (mentions(what, {"timed out", "timeout"})) {
      throw TimeoutError(detail::concat(where, " timed out after ", timeout.count(), " ms; ",
                                        absent, " (transport: ", shorten(what), ")"),
                         __FILE__, __LINE__, op, sequence, global_missing);
    }
    if (mentions(what, {"closed by peer", "reset by peer", "connection", "broken pipe",
                        "read error", "write error", "socket"})) {
      // Only a transfer's own peer is named as the one lost. The ranks behind are suspects, not
      // culprits: a live rank that had not entered the collective yet is behind too, and elastic
      // recovery would leave it out (seen when a whole host was killed: the reset reached one
      // survivor before its neighbour on the same host entered). The agents' exit reports and
      // the heartbeat name the dead ones.
      throw PeerFailure(
          detail::concat(where, " lost a peer; ", absent, " (transport: ", shorten(what), ")"),
          __FILE__, __LINE__, peer >= 0 ? global_missing : std::vector<int>{});
    }
    CHORUS_THROW(CommError, where, " failed: ", shorten(what));
  } catch (...) {
    return std::current_exception();
  }
}

void Work::wait() {
  if (!state_) return;
  State& state = *state_;
  std::lock_guard<std::mutex> lock(state.mutex);
  if (state.done) {
    if (state.error) std::rethrow_exception(state.error);
    return;
  }
  try {
    if (state.work) {
      const auto budget = state.deadline.remaining() + kWaitGrace;
      if (!waitForTransfer(state, budget)) CHORUS_THROW(CommError, state.operation, " was aborted");
    }
    if (state.finish) state.finish();
  } catch (const Error&) {
    state.error = std::current_exception();
  } catch (const std::exception& error) {
    state.error =
        state.group->translate(error, state.operation, state.sequence, state.timeout, state.peer);
  }
  state.done = true;
  state.group->stats->record(state.operation, state.bytes, state.clock.seconds(),
                             state.error != nullptr);
  if (state.error) {
    abandon(state);
    try {
      std::rethrow_exception(state.error);
    } catch (const std::exception& error) {
      state.group->markBroken(error.what());
    }
    std::rethrow_exception(state.error);
  }
}

bool Work::isCompleted() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->done || !state_->work || state_->work->isCompleted();
}

const std::string& Work::operation() const {
  static const std::string kNone = "none";
  return state_ ? state_->operation : kNone;
}

long long Work::sequence() const { return state_ ? state_->sequence : -1; }

}  // namespace chorus::comm
