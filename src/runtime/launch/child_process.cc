#include "launch/child_process.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <filesystem>

#include "chorus/core/error.h"

namespace chorus::runtime {

// What a child exits with when it cannot exec (as a shell would); the errno travels on the status
// pipe.
constexpr int kExecFailedStatus = 127;

std::vector<char*> cStrings(const std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (const std::string& s : strings) pointers.push_back(const_cast<char*>(s.c_str()));
  pointers.push_back(nullptr);
  return pointers;
}

// Finds `name` like execvp() would, but in the PATH the worker will have, not the agent's.
std::string resolveProgram(const std::string& name, const std::map<std::string, std::string>& env,
                           int rank) {
  if (name.find('/') != std::string::npos) return name;  // execve() reports what is wrong with it
  const auto path_entry = env.find("PATH");
  const std::string path = path_entry != env.end() ? path_entry->second : "/usr/bin:/bin";
  std::size_t start = 0;
  for (;;) {
    const std::size_t end = std::min(path.find(':', start), path.size());
    const std::string dir = end > start ? path.substr(start, end - start) : ".";
    const std::string candidate = dir + "/" + name;
    struct stat info {};
    if (::stat(candidate.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
    if (end == path.size()) break;
    start = end + 1;
  }
  CHORUS_THROW(LaunchError, "cannot start rank ", rank, ": program '", name,
               "' was not found in PATH (", path, ")");
}

[[noreturn]] static void childFail(int status_fd) {
  const int error = errno;
  const ssize_t ignored = ::write(status_fd, &error, sizeof error);
  (void)ignored;
  ::_exit(kExecFailedStatus);
}

// Marks every descriptor above stderr close-on-exec, so the worker inherits none of the agent's
// (stores, sockets, other workers' pipes). CLOEXEC rather than close: the status pipe must stay
// open until the exec itself succeeds.
static void markCloexecFrom3(int max_fd) {
#if defined(SYS_close_range) && defined(CLOSE_RANGE_CLOEXEC)
  if (::syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) == 0) return;
#endif
  for (int fd = 3; fd < max_fd; ++fd) {
    const int flags = ::fcntl(fd, F_GETFD);
    if (flags >= 0 && (flags & FD_CLOEXEC) == 0) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
  }
}

// Caught signals would run the agent's handlers in the child until exec, and ignored SIGPIPE or
// SIGXFSZ would survive the exec; give the worker the defaults a shell would.
static void resetSignalsInChild() {
  struct sigaction defaults {};  // sigaction(), unlike signal(), is async-signal-safe
  defaults.sa_handler = SIG_DFL;
  for (int signo = 1; signo < NSIG; ++signo) {
    if (signo == SIGKILL || signo == SIGSTOP) continue;
    struct sigaction current {};
    if (::sigaction(signo, nullptr, &current) != 0) continue;
    const bool caught = (current.sa_flags & SA_SIGINFO) != 0 ||
                        (current.sa_handler != SIG_IGN && current.sa_handler != SIG_DFL);
    if (caught || signo == SIGPIPE || signo == SIGXFSZ) ::sigaction(signo, &defaults, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
}

[[noreturn]] static void execChild(const ChildSetup& setup) {
  ::setpgid(0, 0);  // own group: the agent signals the worker's whole tree with kill(-pid)
  int status_fd = ::fcntl(setup.status_fd, F_DUPFD_CLOEXEC, 3);
  if (status_fd < 0) ::_exit(kExecFailedStatus);
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) childFail(status_fd);
  // The agent may have died before PR_SET_PDEATHSIG took effect; then nobody would kill us.
  if (::getppid() != setup.parent) ::_exit(kExecFailedStatus);
  // Move the three sources above 2 first, so one dup2() onto 0..2 cannot clobber another.
  const int source =
      setup.stdin_fd >= 0 ? setup.stdin_fd : ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const int in = source < 0 ? -1 : ::fcntl(source, F_DUPFD_CLOEXEC, 3);
  const int out = ::fcntl(setup.stdout_fd, F_DUPFD_CLOEXEC, 3);
  const int err = ::fcntl(setup.stderr_fd, F_DUPFD_CLOEXEC, 3);
  if (in < 0 || out < 0 || err < 0) childFail(status_fd);
  if (::dup2(in, 0) < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0) childFail(status_fd);
  markCloexecFrom3(setup.max_fd);
  if (setup.inherited_fd >= 0 && ::fcntl(setup.inherited_fd, F_SETFD, 0) != 0) childFail(status_fd);
  resetSignalsInChild();
  ::execve(setup.program, setup.argv, setup.envp);
  childFail(status_fd);
}

// Waits for `pid` to end and returns its wait status.
int reapBlocking(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

pid_t forkWorker(const ChildSetup& setup, int rank) {
  // Blocked across fork() so no handler of the agent's runs in the child before it resets them.
  sigset_t all, previous;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  const pid_t pid = ::fork();
  if (pid == 0) execChild(setup);
  const int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (pid < 0) CHORUS_THROW(LaunchError, "cannot fork rank ", rank, ": ", ::strerror(fork_errno));
  // Also done by the child: whichever runs first, the group exists before anyone signals it.
  ::setpgid(pid, pid);
  return pid;
}

// Reads the exec status pipe (whose write end the caller closed): EOF means the exec succeeded;
// an errno means it failed, and the child is reaped before the error is thrown.
void awaitExec(int status_fd, pid_t pid, const std::string& program, int rank) {
  int child_errno = 0;
  ssize_t n;
  while ((n = ::read(status_fd, &child_errno, sizeof child_errno)) < 0 && errno == EINTR) {
  }
  if (n <= 0) return;
  reapBlocking(pid);
  CHORUS_THROW(LaunchError, "cannot start rank ", rank, ": cannot execute '", program,
               "': ", ::strerror(child_errno));
}

UniqueFd openLog(const std::string& dir, int rank) {
  const std::string path = dir + "/rank-" + std::to_string(rank) + ".log";
  // Appended to, so a restarted job keeps the earlier attempt's output.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0)
    CHORUS_THROW(LaunchError, "cannot open log file '", path, "' for rank ", rank, ": ",
                 ::strerror(errno));
  return UniqueFd(fd);
}

std::pair<UniqueFd, UniqueFd> makePipe(const char* what) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    CHORUS_THROW(LaunchError, "cannot create the ", what, " pipe: ", ::strerror(errno));
  return {UniqueFd(fds[0]), UniqueFd(fds[1])};
}

}  // namespace chorus::runtime
