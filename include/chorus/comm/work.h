// The handle of an asynchronous communication operation.
//
// Every Communicator operation returns a Work at once; the data moves in the background. wait()
// blocks until the operation finished or its deadline passed, applies any finishing step (the
// division of an average, the unpacking of an uneven gather) and rethrows a failure as a typed
// error: TimeoutError (naming the operation, its sequence number and the ranks that had not
// arrived), PeerFailure (a peer's connection dropped) or CommError.
#pragma once

#include <memory>
#include <string>

namespace chorus::comm {

// Value-like handle sharing the operation's state; copies refer to the same operation. wait() may
// be called from any one thread at a time; after it returned (or threw) further calls return (or
// rethrow) at once.
class Work {
 public:
  // A handle of an operation that needed no communication (e.g. zero elements): already complete.
  Work() = default;

  void wait();
  // True once the operation finished (successfully or not), without blocking.
  bool isCompleted() const;
  // The operation's name and sequence number within its group, e.g. "all_reduce", 17.
  const std::string& operation() const;
  long long sequence() const;

  struct State;  // defined in src/comm/work.cc
  explicit Work(std::shared_ptr<State> state) : state_(std::move(state)) {}

 private:
  std::shared_ptr<State> state_;
};

}  // namespace chorus::comm
