#include "launch/signal_relay.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include <atomic>

#include "chorus/core/error.h"

namespace chorus::runtime {
namespace {

// The one process-wide state of the supervisor, and why it must exist: a signal handler gets
// nothing but the signal number, so the descriptor it writes to has to live where the handler can
// find it. A lock-free atomic is safe to read from a handler.
std::atomic<int> g_relay_write_fd{-1};
// Claimed by the live SignalRelay, so two of them cannot fight over the handlers.
std::atomic<bool> g_relay_active{false};

extern "C" void relaySignal(int signo) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(signo);
  // A full pipe drops the byte; the loop wakes anyway for the bytes already in it.
  const ssize_t ignored = ::write(g_relay_write_fd.load(std::memory_order_relaxed), &byte, 1);
  (void)ignored;
  errno = saved_errno;
}

// The pipe is created once and never closed: a handler running on another thread just as a relay
// is torn down could otherwise write into a descriptor number that meanwhile names another file.
int relayReadFd() {
  static const int read_fd = [] {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
      CHORUS_THROW(LaunchError, "cannot create the supervisor's signal pipe: ", ::strerror(errno));
    g_relay_write_fd.store(fds[1]);
    return fds[0];
  }();
  return read_fd;
}

}  // namespace

SignalRelay::SignalRelay() {
  if (g_relay_active.exchange(true))
    CHORUS_THROW(LaunchError, "another Supervisor is already running in this process");
  try {
    drain();  // bytes left from an earlier relay's last moments
  } catch (...) {
    g_relay_active.store(false);
    throw;
  }
  struct sigaction action {};
  action.sa_handler = relaySignal;
  sigemptyset(&action.sa_mask);
  // SA_RESTART spares the agent's other threads EINTR; SA_NOCLDSTOP because only deaths matter.
  action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  for (std::size_t i = 0; i < std::size(kRelayed); ++i)
    ::sigaction(kRelayed[i], &action, &previous_[i]);

  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGPIPE, &ignore, &previous_pipe_);

  // The agent may block these signals in its threads; unblocking them here guarantees that at
  // least the supervising thread receives them.
  sigset_t relayed;
  sigemptyset(&relayed);
  for (int signo : kRelayed) sigaddset(&relayed, signo);
  ::pthread_sigmask(SIG_UNBLOCK, &relayed, &previous_mask_);
}

SignalRelay::~SignalRelay() {
  for (std::size_t i = 0; i < std::size(kRelayed); ++i)
    ::sigaction(kRelayed[i], &previous_[i], nullptr);
  ::sigaction(SIGPIPE, &previous_pipe_, nullptr);
  ::pthread_sigmask(SIG_SETMASK, &previous_mask_, nullptr);
  g_relay_active.store(false);
}

int SignalRelay::fd() const { return relayReadFd(); }

std::vector<int> SignalRelay::drain() {
  std::vector<int> signals;
  unsigned char buffer[64];
  for (;;) {
    const ssize_t n = ::read(relayReadFd(), buffer, sizeof buffer);
    if (n > 0) {
      signals.insert(signals.end(), buffer, buffer + n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return signals;  // EAGAIN: empty
  }
}

}  // namespace chorus::runtime
