// Private helper of the worker supervisor: delivers SIGINT, SIGTERM and SIGCHLD to its poll()
// loop as bytes on a pipe (the self-pipe trick).
//
// A signal handler may only do async-signal-safe work, so the handler writes the signal number
// to a pipe and the supervisor's loop, which polls the pipe's read end next to the workers'
// output, does the real work. Not part of the public API.
#pragma once

#include <signal.h>

#include <iterator>
#include <vector>

namespace chorus::runtime {

// While alive, catches SIGINT, SIGTERM and SIGCHLD (relaying them to fd()), ignores SIGPIPE (a
// closed agent stdout must not kill the agent while it copies worker output) and unblocks those
// signals in the calling thread. The destructor restores the previous handlers and mask.
//
// Handlers are process-wide, so at most one relay may be alive at a time; a second one throws
// LaunchError. Create and destroy it on the same thread; not thread-safe otherwise.
class SignalRelay {
 public:
  SignalRelay();
  ~SignalRelay();
  SignalRelay(const SignalRelay&) = delete;
  SignalRelay& operator=(const SignalRelay&) = delete;

  // Read end of the pipe (non-blocking): readable when a signal arrived.
  int fd() const;
  // Signal numbers received since the last call, in order of arrival (SIGCHLD included).
  std::vector<int> drain();

 private:
  static constexpr int kRelayed[] = {SIGINT, SIGTERM, SIGCHLD};
  struct sigaction previous_[std::size(kRelayed)];
  struct sigaction previous_pipe_;
  sigset_t previous_mask_;
};

}  // namespace chorus::runtime
