#include "chorus/runtime/launch/supervisor.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <utility>

#include "chorus/core/clock.h"
#include "chorus/core/error.h"
#include "chorus/core/logging.h"
#include "chorus/runtime/launch/identity.h"
#include "launch/child_process.h"
#include "launch/output_pump.h"
#include "launch/signal_relay.h"

namespace chorus::runtime {

struct Supervisor::Worker {
  int rank = 0;
  pid_t pid = -1;  // also the id of the worker's process group
  bool running = true;
  bool stop_requested = false;
  UniqueFd out;  // read ends of the worker's stdout and stderr pipes; closed at EOF
  UniqueFd err;
  UniqueFd log;
  // WorkerLaunch::secret_on_stdin: the write end of its standard input, open while it runs.
  UniqueFd stdin_write;
  std::unique_ptr<OutputPump> out_pump;
  std::unique_ptr<OutputPump> err_pump;
};

struct Supervisor::RunState {
  SignalRelay relay;
  SupervisorOutcome outcome;
  bool stopping = false;
  bool killed = false;  // SIGKILL sent to every remaining worker
  Clock::time_point kill_at{};
};

namespace {

// After the last worker exited, its pipes normally reach EOF at once; only a process that left
// the worker's group (setsid, daemons) can hold them open, and run() does not wait for it long.
constexpr Millis kDrainTimeout{1000};
// Reads per stream per poll round, so one chatty worker cannot starve the others.
constexpr int kReadsPerRound = 16;

// "SIGKILL" for 9; empty when the C library cannot name the signal.
std::string signalName(int signo) {
#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 32)
  if (const char* abbreviation = ::sigabbrev_np(signo)) return std::string("SIG") + abbreviation;
#endif
  return "";
}

// Time from now until `when`, rounded up so a poll() never wakes just before its deadline.
Millis until(Clock::time_point when) {
  const auto left = std::chrono::ceil<Millis>(when - Clock::now());
  return std::max(left, Millis(0));
}

// A pipe already holding `text` (far below a pipe's capacity, JobSecret::kMaxLength, so the write
// never blocks), both ends open.
std::pair<UniqueFd, UniqueFd> pipeHolding(const std::string& text, const char* what, int rank) {
  auto ends = makePipe(what);
  const ssize_t written = ::write(ends.second.get(), text.data(), text.size());
  if (written != static_cast<ssize_t>(text.size()))
    CHORUS_THROW(LaunchError, "cannot hand rank ", rank, " the job secret: ", ::strerror(errno));
  return ends;
}

}  // namespace

std::string WorkerExit::describe() const {
  std::string who = detail::concat("rank ", rank, " (pid ", pid, ")");
  if (!signaled) return detail::concat(who, " exited with code ", code);
  const std::string name = signalName(code);
  return detail::concat(who, " was killed by signal ", code, name.empty() ? "" : " (" + name + ")");
}

bool SupervisorOutcome::ok() const {
  if (first_failure || interrupt_signal != 0 || !external_failure.empty()) return false;
  return std::all_of(exits.begin(), exits.end(), [](const WorkerExit& e) { return e.success(); });
}

Supervisor::Supervisor(SupervisorOptions options) : options_(std::move(options)) {
  CHORUS_CHECK_CONFIG(options_.grace.count() >= 0, "supervisor grace must not be negative");
  CHORUS_CHECK_CONFIG(options_.poll_interval.count() > 0, "supervisor poll interval must be > 0");
}

Supervisor::~Supervisor() { killAll(); }

void Supervisor::start(const std::vector<WorkerLaunch>& launches) {
  if (started_) CHORUS_THROW(LaunchError, "Supervisor::start() called twice");
  started_ = true;
  for (const WorkerLaunch& launch : launches) reserveRank(launch);
  if (!options_.log_dir.empty()) {
    std::error_code error;
    std::filesystem::create_directories(options_.log_dir, error);
    if (error)
      CHORUS_THROW(LaunchError, "cannot create log directory '", options_.log_dir,
                   "': ", error.message());
  }
  base_env_ = processEnvironment();
  try {
    for (const WorkerLaunch& launch : launches) workers_.push_back(spawn(launch));
  } catch (...) {
    killAll();
    throw;
  }
}

bool Supervisor::add(const WorkerLaunch& launch) {
  if (!started_ || (ran_ && !run_state_))
    CHORUS_THROW(LaunchError, "Supervisor::add() must follow start() and precede run()'s return");
  if (run_state_ && (run_state_->stopping || mustStop(run_state_->outcome))) return false;
  reserveRank(launch);
  workers_.push_back(spawn(launch));
  return true;
}

void Supervisor::reserveRank(const WorkerLaunch& launch) {
  CHORUS_CHECK_CONFIG(!launch.argv.empty(), "rank ", launch.rank, ": empty command line");
  CHORUS_CHECK_CONFIG(ranks_.insert(launch.rank).second, "rank ", launch.rank, " given twice");
}

std::unique_ptr<Supervisor::Worker> Supervisor::spawn(const WorkerLaunch& launch) {
  Environment env = base_env_;
  for (const auto& [key, value] : launch.env) env[key] = value;
  UniqueFd secret_read;
  std::pair<UniqueFd, UniqueFd> stdin_pipe;
  if (launch.secret_on_stdin) {
    CHORUS_CHECK_CONFIG(!launch.secret.empty(), "rank ", launch.rank,
                        ": secret_on_stdin without a secret");
    // The secret's line, the write end kept open while the worker runs.
    stdin_pipe = pipeHolding(launch.secret.text() + "\n", "standard input", launch.rank);
  } else if (!launch.secret.empty()) {
    // Closed for writing at once: the worker reads to the end without ever blocking, and nothing
    // of the secret stays in the agent but the read end until fork.
    secret_read = std::move(pipeHolding(launch.secret.text(), "job secret", launch.rank).first);
    env[env::kSecretFd] = std::to_string(secret_read.get());
  }
  std::vector<std::string> env_strings;
  for (const auto& [key, value] : env) env_strings.push_back(key + "=" + value);
  const std::string program = resolveProgram(launch.argv[0], env, launch.rank);
  const std::vector<char*> argv = cStrings(launch.argv);
  const std::vector<char*> envp = cStrings(env_strings);

  auto worker = std::make_unique<Worker>();
  worker->rank = launch.rank;
  if (!options_.log_dir.empty()) worker->log = openLog(options_.log_dir, launch.rank);
  auto [out_read, out_write] = makePipe("stdout");
  auto [err_read, err_write] = makePipe("stderr");
  auto [status_read, status_write] = makePipe("exec status");
  const int max_fd = static_cast<int>(std::clamp(::sysconf(_SC_OPEN_MAX), 256L, 65536L));
  worker->pid = forkWorker({program.c_str(), argv.data(), envp.data(), ::getpid(), out_write.get(),
                            err_write.get(), status_write.get(), max_fd, secret_read.get(),
                            stdin_pipe.first.valid() ? stdin_pipe.first.get() : -1},
                           launch.rank);
  secret_read.reset();  // the worker holds the only reader now
  stdin_pipe.first.reset();
  worker->stdin_write = std::move(stdin_pipe.second);
  out_write.reset();
  err_write.reset();
  status_write.reset();
  awaitExec(status_read.get(), worker->pid, program, launch.rank);

  ::fcntl(out_read.get(), F_SETFL, O_NONBLOCK);
  ::fcntl(err_read.get(), F_SETFL, O_NONBLOCK);
  worker->out = std::move(out_read);
  worker->err = std::move(err_read);
  const std::string prefix =
      options_.prefix_output ? detail::concat("[rank ", launch.rank, "] ") : "";
  worker->out_pump = std::make_unique<OutputPump>(prefix, options_.stdout_fd, worker->log.get());
  worker->err_pump = std::make_unique<OutputPump>(prefix, options_.stderr_fd, worker->log.get());
  return worker;
}

SupervisorOutcome Supervisor::run(const ExternalCheck& external_check) {
  if (!started_ || ran_) CHORUS_THROW(LaunchError, "Supervisor::run() must follow start(), once");
  ran_ = true;
  RunState state;
  run_state_ = &state;
  // Cleared however run() ends: add() must not reach a finished run's state.
  struct Detach {
    RunState*& state;
    ~Detach() { state = nullptr; }
  } detach{run_state_};
  Clock::time_point next_check = Clock::now() + options_.poll_interval;
  for (;;) {
    reapExited(state);
    if (!state.stopping && mustStop(state.outcome)) beginStop(state);
    if (!anyRunning()) break;
    if (state.stopping && !state.killed && Clock::now() >= state.kill_at) {
      logWarn("workers still running ", options_.grace.count(),
              " ms after SIGTERM; sending SIGKILL");
      signalRunning(SIGKILL);
      state.killed = true;
    }
    Clock::time_point wake = Clock::now() + options_.poll_interval;
    if (state.stopping && !state.killed) wake = std::min(wake, state.kill_at);
    if (!state.stopping && external_check) wake = std::min(wake, next_check);
    pollOnce(state, until(wake));
    if (!state.stopping && external_check && Clock::now() >= next_check) {
      if (std::optional<std::string> message = external_check())
        state.outcome.external_failure = message->empty() ? "external check failed" : *message;
      next_check = Clock::now() + options_.poll_interval;
    }
  }
  drainOutput(state);
  return std::move(state.outcome);
}

void Supervisor::reapExited(RunState& state) {
  // By index: on_exit may add() workers, and those are looked at in the same pass.
  for (std::size_t i = 0; i < workers_.size(); ++i) {
    Worker* worker = workers_[i].get();
    if (!worker->running) continue;
    siginfo_t info{};
    // WNOWAIT leaves the zombie in place: it pins the group id while we clear the group below.
    int rc;
    while ((rc = ::waitid(P_PID, worker->pid, &info, WEXITED | WNOHANG | WNOWAIT)) < 0 &&
           errno == EINTR) {
    }
    if (rc == 0 && info.si_pid == 0) continue;  // still running
    int status = 0;
    if (rc == 0) {
      // The worker's group must not outlive it: whatever it left running there is orphaned.
      ::kill(-worker->pid, SIGKILL);
      status = reapBlocking(worker->pid);
    } else {
      // ECHILD: someone else reaped it (SIGCHLD ignored before run()); its status is lost.
      logWarn("rank ", worker->rank, " (pid ", worker->pid, ") was reaped elsewhere");
      status = 255 << 8;
    }
    recordExit(state, *worker, status);
  }
}

void Supervisor::recordExit(RunState& state, Worker& worker, int status) {
  worker.running = false;
  worker.stdin_write.reset();
  WorkerExit exit;
  exit.rank = worker.rank;
  exit.pid = worker.pid;
  exit.signaled = WIFSIGNALED(status);
  exit.code = exit.signaled ? WTERMSIG(status) : WEXITSTATUS(status);
  exit.stopped = worker.stop_requested;
  state.outcome.exits.push_back(exit);
  if (!exit.success() && !exit.stopped && !state.outcome.first_failure)
    state.outcome.first_failure = exit;
  if (options_.on_exit) options_.on_exit(exit);
}

bool Supervisor::mustStop(const SupervisorOutcome& outcome) const {
  return (outcome.first_failure && options_.stop_on_failure) || outcome.interrupt_signal != 0 ||
         !outcome.external_failure.empty();
}

void Supervisor::beginStop(RunState& state) {
  const SupervisorOutcome& outcome = state.outcome;
  if (outcome.first_failure && options_.stop_on_failure)
    logWarn(outcome.first_failure->describe(), "; stopping the other workers");
  else if (outcome.interrupt_signal != 0)
    logWarn("agent received ", signalName(outcome.interrupt_signal), "; stopping the workers");
  else
    logWarn("stopping the workers: ", outcome.external_failure);
  state.stopping = true;
  for (auto& worker : workers_) worker->stop_requested = worker->running;
  if (options_.grace.count() == 0) {
    signalRunning(SIGKILL);
    state.killed = true;
    return;
  }
  for (auto& worker : workers_) {
    if (!worker->running) continue;
    // A launcher of remote workers stops when its standard input ends (secret_on_stdin).
    if (worker->stdin_write.valid())
      worker->stdin_write.reset();
    else if (::kill(-worker->pid, SIGTERM) != 0)
      ::kill(worker->pid, SIGTERM);
  }
  state.kill_at = Clock::now() + options_.grace;
}

void Supervisor::signalRunning(int signo) {
  for (auto& worker : workers_) {
    // The worker may have moved itself to another group; then at least the worker is signalled.
    if (worker->running && ::kill(-worker->pid, signo) != 0) ::kill(worker->pid, signo);
  }
}

void Supervisor::pollOnce(RunState& state, Millis timeout) {
  std::vector<pollfd> fds{{state.relay.fd(), POLLIN, 0}};
  std::vector<std::pair<Worker*, bool>> streams;  // (worker, is stderr) for fds[1...]
  for (auto& worker : workers_) {
    for (bool is_err : {false, true}) {
      const UniqueFd& fd = is_err ? worker->err : worker->out;
      if (!fd.valid()) continue;
      fds.push_back({fd.get(), POLLIN, 0});
      streams.emplace_back(worker.get(), is_err);
    }
  }
  const int wait_ms = static_cast<int>(std::min<long long>(timeout.count(), INT_MAX));
  if (::poll(fds.data(), fds.size(), wait_ms) < 0) {
    if (errno == EINTR) return;
    CHORUS_THROW(LaunchError, "supervisor poll() failed: ", ::strerror(errno));
  }
  if (fds[0].revents != 0) handleSignals(state);
  for (std::size_t i = 1; i < fds.size(); ++i) {
    if (fds[i].revents != 0) readOutput(*streams[i - 1].first, streams[i - 1].second);
  }
}

void Supervisor::readOutput(Worker& worker, bool err_stream) {
  UniqueFd& fd = err_stream ? worker.err : worker.out;
  OutputPump& pump = err_stream ? *worker.err_pump : *worker.out_pump;
  char buffer[16 * 1024];
  for (int i = 0; i < kReadsPerRound; ++i) {
    const ssize_t n = ::read(fd.get(), buffer, sizeof buffer);
    if (n > 0) {
      pump.feed(std::string_view(buffer, static_cast<std::size_t>(n)));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    pump.finish();  // EOF (or a read error, which ends the stream all the same)
    fd.reset();
    return;
  }
}

void Supervisor::handleSignals(RunState& state) {
  for (int signo : state.relay.drain()) {
    if (signo != SIGINT && signo != SIGTERM) continue;  // SIGCHLD only wakes us up to reap
    if (state.outcome.interrupt_signal == 0) {
      state.outcome.interrupt_signal = signo;
    } else if (state.stopping && !state.killed) {
      logWarn("agent received ", signalName(signo), " again; killing the workers now");
      signalRunning(SIGKILL);
      state.killed = true;
    }
  }
}

void Supervisor::drainOutput(RunState& state) {
  const Clock::time_point deadline = Clock::now() + kDrainTimeout;
  auto anyOpen = [this] {
    return std::any_of(workers_.begin(), workers_.end(),
                       [](const auto& w) { return w->out.valid() || w->err.valid(); });
  };
  while (anyOpen() && Clock::now() < deadline)
    pollOnce(state, std::min(options_.poll_interval, until(deadline)));
  for (auto& worker : workers_) {
    if (worker->out.valid() || worker->err.valid())
      logWarn("output of rank ", worker->rank, " still open after it exited; not copied further");
    for (bool is_err : {false, true}) {
      UniqueFd& fd = is_err ? worker->err : worker->out;
      if (!fd.valid()) continue;
      (is_err ? worker->err_pump : worker->out_pump)->finish();
      fd.reset();
    }
  }
}

bool Supervisor::anyRunning() const {
  return std::any_of(workers_.begin(), workers_.end(), [](const auto& w) { return w->running; });
}

void Supervisor::killAll() {
  for (auto& worker : workers_) {
    if (worker->running && ::kill(-worker->pid, SIGKILL) != 0) ::kill(worker->pid, SIGKILL);
  }
  for (auto& worker : workers_) {
    if (!worker->running) continue;
    reapBlocking(worker->pid);
    worker->running = false;
  }
}

std::vector<pid_t> Supervisor::pids() const {
  std::vector<pid_t> pids;
  for (const auto& worker : workers_) pids.push_back(worker->pid);
  return pids;
}

}  // namespace chorus::runtime
