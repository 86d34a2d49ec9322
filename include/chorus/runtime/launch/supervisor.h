// The worker supervisor: starts a node's worker processes, copies their output, and stops them
// all when one fails (unless told to let the others go on, for elastic jobs).
//
// The per-node agent (`chorus run`, like torchrun) starts one worker process per device through a
// Supervisor and then blocks in run(). The job on this node ends when every worker exited, or as
// soon as one worker fails (SupervisorOptions::stop_on_failure), the agent gets SIGINT/SIGTERM, or
// the agent's external check (e.g. "another node's agent reported a failure") says so: then every
// remaining worker gets SIGTERM, then SIGKILL after a grace period, so a dead worker never leaves
// its peers hanging in a collective. In an elastic job the survivors detect the lost peer
// themselves and go on; the agent learns of each exit as it is reaped (SupervisorOptions::on_exit),
// tells them through the job's store, and may start a replacement (Supervisor::add). Plain POSIX;
// Linux-specific only in PR_SET_PDEATHSIG.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "chorus/comm/store/job_secret.h"

namespace chorus::runtime {

// How to start one worker.
struct WorkerLaunch {
  // Global rank; names the worker in output prefixes, log files and messages. Unique per
  // Supervisor, over every worker it ever started (start() and add()).
  int rank = 0;
  // Program and arguments. REQUIRES: not empty. A program without '/' is looked up in the PATH of
  // the worker's environment (below).
  std::vector<std::string> argv;
  // Variables added to, or overriding, the agent's own environment.
  std::map<std::string, std::string> env;
  // Default: empty (none). When set, handed to the worker through a pipe it inherits, filled and
  // closed for writing before the worker starts, whose descriptor number is in CHORUS_SECRET_FD
  // (runtime::env::kSecretFd): a secret in `env` would be readable in /proc/PID/environ by every
  // process of the user.
  comm::JobSecret secret;
  // Default: false. When true (and `secret` is set), the secret goes to the worker as the first
  // line of its standard input instead of CHORUS_SECRET_FD, and that pipe stays open while the
  // worker runs: the worker is a launcher of remote workers (`ssh HOST chorus run
  // --secret-stdin`, runtime::runOnHosts), which forwards the line to the far end and reports the
  // pipe's end there. Such a worker is stopped by closing the pipe (end of file: the far end stops
  // its own workers, with their grace, and exits, and so does ssh) instead of SIGTERM; SIGKILL
  // after the grace as any other.
  bool secret_on_stdin = false;
};

// How one worker ended.
struct WorkerExit {
  int rank = -1;
  pid_t pid = -1;
  // True when killed by a signal; then `code` is the signal number, otherwise the exit status.
  bool signaled = false;
  int code = 0;
  // True when the supervisor had asked it to stop (SIGTERM or SIGKILL) before it ended.
  bool stopped = false;

  // Exited with status 0.
  bool success() const { return !signaled && code == 0; }
  // "rank 2 (pid 1234) exited with code 3" or
  // "rank 2 (pid 1234) was killed by signal 9 (SIGKILL)".
  std::string describe() const;
};

struct SupervisorOptions {
  // Default: true. Each line of a worker's stdout/stderr is copied to the agent's stdout/stderr as
  // "[rank N] line"; when false the lines are copied bare (still whole lines, never torn).
  bool prefix_output = true;
  // Default: "" (none). When set, each rank's output (both streams, unprefixed) is also appended to
  // <log_dir>/rank-<N>.log; the directory is created if missing.
  std::string log_dir;
  // Default: 3 s. Time between SIGTERM and SIGKILL when stopping workers.
  std::chrono::milliseconds grace{3000};
  // Default: 200 ms. How often run() calls the external check; also the longest run() sleeps
  // between checks of its workers.
  std::chrono::milliseconds poll_interval{200};
  // Default: 1 (the agent's stdout). Where workers' stdout lines go; not owned.
  int stdout_fd = 1;
  // Default: 2 (the agent's stderr). Where workers' stderr lines go; not owned.
  int stderr_fd = 2;
  // Default: true. A worker that exits non-zero or is killed by a signal on its own stops every
  // other worker. When false the others go on (elastic jobs: the survivors continue without it);
  // the failure is still recorded in SupervisorOutcome::first_failure, and SIGINT/SIGTERM or the
  // external check still stop everyone.
  bool stop_on_failure = true;
  // Default: none. Called on the run() thread for each worker's end as soon as it is reaped (run()
  // wakes on SIGCHLD, so within milliseconds of the exit), before run() looks at the next one,
  // with the same WorkerExit that SupervisorOutcome::exits records. Workers the supervisor stopped
  // are reported too (`stopped` is set). It may start a replacement with Supervisor::add(). It
  // should return quickly: output is not copied meanwhile. If it throws, the exception propagates
  // out of run() and the workers are left to the destructor.
  std::function<void(const WorkerExit&)> on_exit;
};

// What run() saw.
struct SupervisorOutcome {
  // Every worker's end, in order of exit.
  std::vector<WorkerExit> exits;
  // The first worker that exited non-zero or by a signal on its own (workers the supervisor
  // stopped do not count), whether or not it stopped the others (stop_on_failure).
  std::optional<WorkerExit> first_failure;
  // SIGINT or SIGTERM received by the agent during run(); 0 if none.
  int interrupt_signal = 0;
  // The message of the external check that stopped the job; empty if it did not.
  std::string external_failure;

  // Every worker exited 0, with no interrupt and no external failure.
  bool ok() const;
};

// Returns a message (why the job must stop) or nothing (carry on).
using ExternalCheck = std::function<std::optional<std::string>()>;

// Owns the worker processes of one agent: starts them (all at once with start(), then one at a
// time with add(), e.g. a replacement for a lost one), copies their output, reaps them, and never
// leaves one behind: each worker runs in a process group of its own (signals reach the whole tree
// it started), a group is SIGKILLed as soon as its worker (the leader) ends, and the destructor
// SIGKILLs and reaps whatever still runs. If the agent itself is SIGKILLed, PR_SET_PDEATHSIG kills
// each worker, but not processes the worker started: a worker that starts helpers (e.g. data
// loader processes) should make them watch their parent, as PyTorch's DataLoader does. Processes
// that leave their worker's group (setsid) are beyond the supervisor's reach.
//
// While run() is active it owns the process's SIGINT, SIGTERM, SIGCHLD and SIGPIPE handlers
// (restored when it returns), so at most one Supervisor may be in run() per process.
// Not thread-safe: use one Supervisor from one thread. Not copyable.
class Supervisor {
 public:
  explicit Supervisor(SupervisorOptions options);
  // SIGKILLs every worker's process group that still runs and reaps the workers.
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Starts every worker, in order. Returns once each worker's exec() succeeded. Reads the agent's
  // environment (`environ`) once to build the workers'. Throws ConfigError for an empty argv or a
  // repeated rank, and LaunchError naming the program and rank when a worker cannot be started
  // (not found, not executable, fork failed, log file not writable); the workers already started
  // are then killed and reaped before the exception leaves. REQUIRES: called once, before run(),
  // from a thread that outlives the workers: PR_SET_PDEATHSIG fires when the *thread* that forked
  // a worker ends, so call it from the agent's main thread.
  void start(const std::vector<WorkerLaunch>& workers);

  // Starts one more worker, typically a replacement for one that ended, from
  // SupervisorOptions::on_exit. Before run() it always starts it. During run() it starts it
  // unless run() is stopping the workers or is about to (SIGINT/SIGTERM, the external check, or a
  // failure with stop_on_failure): then it starts nothing and returns false. A worker added during
  // run() is supervised like the others: output copied, its end reported to on_exit and recorded
  // in SupervisorOutcome::exits, and run() waits for it. Uses the environment start() read.
  // Throws ConfigError for an empty argv or a rank this Supervisor was given before, and
  // LaunchError when the worker cannot be started (as start()); the other workers are left
  // running either way. REQUIRES: start() was called and run() has not returned; called from the
  // thread running run() (e.g. in on_exit) or, before run(), the thread that called start(): a
  // thread that outlives the worker.
  bool add(const WorkerLaunch& worker);

  // Blocks until all workers exited, or one failed (only with stop_on_failure), or the agent got
  // SIGINT/SIGTERM, or `external_check` (called every poll_interval, may be empty) returned a
  // message. In the last three cases every remaining worker's group gets SIGTERM, then SIGKILL
  // after `grace`; run()
  // returns within about grace + 1 s once the cause is seen. A second SIGINT/SIGTERM while
  // stopping sends SIGKILL at once. In every case all workers are reaped and their output drained
  // before it returns. No deadline of its own: a training job may run for days; the external
  // check is the way to impose one. If the check throws, the exception propagates and the workers
  // are left to the destructor. REQUIRES: start() was called; called once.
  SupervisorOutcome run(const ExternalCheck& external_check = {});

  // Process ids of the started workers (start() and add()), in start order; each is also its
  // worker's process group id.
  std::vector<pid_t> pids() const;

 private:
  struct Worker;    // one started worker: its process, pipes and output pumps
  struct RunState;  // the state of one run(): outcome so far, signal relay, stop progress
  using Environment = std::map<std::string, std::string>;

  void reserveRank(const WorkerLaunch& launch);
  std::unique_ptr<Worker> spawn(const WorkerLaunch& launch);
  void reapExited(RunState& state);
  void pollOnce(RunState& state, std::chrono::milliseconds timeout);
  void readOutput(Worker& worker, bool err_stream);
  void recordExit(RunState& state, Worker& worker, int status);
  bool mustStop(const SupervisorOutcome& outcome) const;
  void handleSignals(RunState& state);
  void beginStop(RunState& state);
  void signalRunning(int signo);
  void drainOutput(RunState& state);
  bool anyRunning() const;
  void killAll();

  SupervisorOptions options_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::set<int> ranks_;            // of every worker started, so that add() never reuses one
  Environment base_env_;           // the agent's environment, read once by start()
  RunState* run_state_ = nullptr;  // while run() is active
  bool started_ = false;
  bool ran_ = false;
};

}  // namespace chorus::runtime
