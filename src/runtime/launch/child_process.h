// Private to runtime: starting a worker process safely from a multi-threaded agent — fork, the
// async-signal-safe child side, exec with a status pipe — and the descriptors around it.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "launch/output_pump.h"

namespace chorus::runtime {

// Everything the child needs, prepared before fork(): between fork() and exec() a child of a
// multi-threaded agent may only make async-signal-safe calls, so it must not allocate.
struct ChildSetup {
  const char* program;
  char* const* argv;
  char* const* envp;
  pid_t parent;
  int stdout_fd;
  int stderr_fd;
  int status_fd;  // write end of the CLOEXEC pipe that reports a failed exec
  int max_fd;
  int inherited_fd;  // kept open across exec, at the same number (the secret pipe); -1: none
  int stdin_fd;      // becomes the child's standard input; -1: /dev/null
};

// NUL-terminated pointers into `strings` (which must outlive them), for execve().
std::vector<char*> cStrings(const std::vector<std::string>& strings);
// Finds `name` like execvp() would, but in the PATH the worker will have, not the agent's.
std::string resolveProgram(const std::string& name, const std::map<std::string, std::string>& env,
                           int rank);
// Waits for `pid` to end and returns its wait status.
int reapBlocking(pid_t pid);
// Forks the worker: its own process group, death signal tied to the agent, default signals,
// stdin (or /dev/null), stdout and stderr on the given descriptors, every other descriptor but
// setup.inherited_fd closed at exec. Throws LaunchError.
pid_t forkWorker(const ChildSetup& setup, int rank);
// Reads the exec status pipe (whose write end the caller closed): EOF means the exec succeeded;
// an errno means it failed, and the child is reaped before the error is thrown.
void awaitExec(int status_fd, pid_t pid, const std::string& program, int rank);
// DIR/rank-N.log, for appending. Throws LaunchError.
UniqueFd openLog(const std::string& dir, int rank);
// A pipe; throws LaunchError naming `what`.
std::pair<UniqueFd, UniqueFd> makePipe(const char* what);

}  // namespace chorus::runtime
