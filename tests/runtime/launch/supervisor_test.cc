#include "chorus/runtime/launch/supervisor.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "chorus/core/clock.h"
#include "chorus/core/error.h"
#include "runtime/supervisor_harness.h"

namespace chorus::runtime {
namespace {

using std::chrono::milliseconds;
using testing::exitOf;
using testing::Harness;
using testing::shell;
using testing::TempDir;
using testing::waitFor;

bool processGone(pid_t pid) { return ::kill(pid, 0) == -1 && errno == ESRCH; }

// A killed grandchild is reparented and stays a zombie member of its group until reaped. Tests that
// check a group call this first, so the orphans come to the test process, which reaps them at
// once, instead of to init, which may take seconds.
void adoptOrphans() { ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0); }

// Whether no process of the group is left, once the ones just killed had a moment to die.
bool groupGone(pid_t pgid) {
  const Deadline deadline = Deadline::after(milliseconds(1000));
  for (;;) {
    while (::waitpid(-pgid, nullptr, WNOHANG) > 0) {
    }
    if (::kill(-pgid, 0) == -1 && errno == ESRCH) return true;
    if (deadline.expired()) return false;
    ::usleep(5 * 1000);
  }
}

TEST(Supervisor, AllRanksExitingZeroIsOk) {
  Harness h;
  Supervisor supervisor(h.options());
  supervisor.start({shell(0, "exit 0"), shell(1, "true"), shell(2, "sleep 0.1")});
  const SupervisorOutcome outcome = supervisor.run();
  EXPECT_TRUE(outcome.ok());
  ASSERT_EQ(outcome.exits.size(), 3u);
  for (int rank : {0, 1, 2}) {
    EXPECT_TRUE(exitOf(outcome, rank).success());
    EXPECT_FALSE(exitOf(outcome, rank).stopped);
  }
  EXPECT_EQ(outcome.exits.back().rank, 2);  // in order of exit: the sleeper ends last
  EXPECT_FALSE(outcome.first_failure);
  EXPECT_EQ(outcome.interrupt_signal, 0);
}

TEST(Supervisor, NoWorkersIsOk) {
  Harness h;
  Supervisor supervisor(h.options());
  supervisor.start({});
  EXPECT_TRUE(supervisor.run().ok());
}

TEST(Supervisor, PrefixesEachLineWithItsRankOnTheMatchingStream) {
  Harness h;
  Supervisor supervisor(h.options());
  supervisor.start({shell(0, "echo one; echo two; printf tail"), shell(1, "echo oops >&2")});
  ASSERT_TRUE(supervisor.run().ok());
  const std::string out = h.out.text();
  EXPECT_NE(out.find("[rank 0] one\n[rank 0] two\n[rank 0] tail\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("oops"), std::string::npos);
  EXPECT_EQ(h.err.text(), "[rank 1] oops\n");
}

TEST(Supervisor, WithoutPrefixCopiesBareLines) {
  Harness h;
  SupervisorOptions options = h.options();
  options.prefix_output = false;
  Supervisor supervisor(options);
  supervisor.start({shell(4, "echo plain")});
  ASSERT_TRUE(supervisor.run().ok());
  EXPECT_EQ(h.out.text(), "plain\n");
}

TEST(Supervisor, SplitsOverlongLinesAt64KiB) {
  Harness h;
  Supervisor supervisor(h.options());
  supervisor.start({shell(0, "head -c 100000 /dev/zero | tr '\\0' a")});
  ASSERT_TRUE(supervisor.run().ok());
  EXPECT_EQ(h.out.text(), "[rank 0] " + std::string(65536, 'a') + "\n[rank 0] " +
                              std::string(100000 - 65536, 'a') + "\n");
}

TEST(Supervisor, LinesOfConcurrentWorkersStayWhole) {
  Harness h;
  Supervisor supervisor(h.options());
  std::vector<WorkerLaunch> launches;
  const std::string body(120, 'x');
  for (int rank = 0; rank < 4; ++rank)
    launches.push_back(shell(rank, "i=0; while [ $i -lt 300 ]; do echo r" + std::to_string(rank) +
                                       body + "; i=$((i+1)); done"));
  supervisor.start(launches);
  ASSERT_TRUE(supervisor.run().ok());
  std::istringstream lines(h.out.text());
  std::map<int, int> count;
  for (std::string line; std::getline(lines, line);) {
    const int rank = line.size() > 7 ? line[6] - '0' : -1;
    ASSERT_EQ(line, "[rank " + std::to_string(rank) + "] r" + std::to_string(rank) + body);
    ++count[rank];
  }
  EXPECT_EQ(count, (std::map<int, int>{{0, 300}, {1, 300}, {2, 300}, {3, 300}}));
}

TEST(Supervisor, ChildGetsExtraAndInheritedEnvironmentAndProgramFromPath) {
  ::setenv("CHORUS_TEST_INHERITED", "from-agent", 1);
  ::setenv("CHORUS_TEST_OVERRIDDEN", "old", 1);
  Harness h;
  Supervisor supervisor(h.options());
  supervisor.start({WorkerLaunch{
      0,
      {"sh", "-c", "echo $CHORUS_TEST_X $CHORUS_TEST_INHERITED $CHORUS_TEST_OVERRIDDEN"},
      {{"CHORUS_TEST_X", "42"}, {"CHORUS_TEST_OVERRIDDEN", "new"}},
      {}}});
  ASSERT_TRUE(supervisor.run().ok());
  EXPECT_EQ(h.out.text(), "[rank 0] 42 from-agent new\n");
  ::unsetenv("CHORUS_TEST_INHERITED");
  ::unsetenv("CHORUS_TEST_OVERRIDDEN");
}

TEST(Supervisor, HandsTheSecretThroughAnInheritedPipeNotTheEnvironment) {
  Harness h;
  Supervisor supervisor(h.options());
  WorkerLaunch launch =
      shell(0, "cat /dev/fd/$CHORUS_SECRET_FD; echo; env | grep -c supervisor-test-secret; exit 0");
  launch.secret = comm::JobSecret::fromText("supervisor-test-secret-0123");
  supervisor.start({launch});
  ASSERT_TRUE(supervisor.run().ok());
  EXPECT_EQ(h.out.text(), "[rank 0] supervisor-test-secret-0123\n[rank 0] 0\n");
}

TEST(Supervisor, HandsTheSecretOnAnOpenStdinAndStopsByClosingIt) {
  Harness h;
  SupervisorOptions options = h.options();
  options.grace = milliseconds(20000);  // the worker must end on the closed input, not a SIGKILL
  Supervisor supervisor(options);
  // Reads the line, then waits for the end of its input, ignoring SIGTERM as a remote agent's
  // ssh would not see one.
  WorkerLaunch launch = shell(
      0, "trap '' TERM; read line; echo \"got $line\"; cat >/dev/null; echo 'input ended'; exit 0");
  launch.secret = comm::JobSecret::fromText("supervisor-test-secret-0123");
  launch.secret_on_stdin = true;
  supervisor.start({launch});
  const Clock::time_point start = Clock::now();
  const SupervisorOutcome outcome = supervisor.run([&h]() -> std::optional<std::string> {
    if (h.out.text().find("got") == std::string::npos) return std::nullopt;
    return std::string("stop");
  });
  EXPECT_LT(Clock::now() - start, milliseconds(10000));
  EXPECT_EQ(h.out.text(), "[rank 0] got supervisor-test-secret-0123\n[rank 0] input ended\n");
  ASSERT_EQ(outcome.exits.size(), 1u);
  EXPECT_TRUE(outcome.exits[0].success());
  EXPECT_TRUE(outcome.exits[0].stopped);
}

TEST(Supervisor, ChildHasNullStdinAndNoInheritedDescriptors) {
  const int leaked = ::open("/dev/null", O_RDONLY);  // deliberately without O_CLOEXEC
  ASSERT_GE(leaked, 3);
  Harness h;
  Supervisor supervisor(h.options());
  supervisor.start({WorkerLaunch{0, {"/bin/sleep", "60"}, {}, {}}});
  ::close(leaked);
  const std::string fd_dir = "/proc/" + std::to_string(supervisor.pids()[0]) + "/fd";
  // The dynamic loader of the new program opens files for a moment; a leaked descriptor stays.
  const std::set<std::string> expected{"0", "1", "2"};
  std::set<std::string> fds;
  for (const Deadline deadline = Deadline::after(milliseconds(2000)); !deadline.expired();) {
    fds.clear();
    for (const auto& entry : std::filesystem::directory_iterator(fd_dir))
      fds.insert(entry.path().filename().string());
    if (fds == expected) break;
    ::usleep(5 * 1000);
  }
  EXPECT_EQ(fds, expected);
  EXPECT_EQ(std::filesystem::read_symlink(fd_dir + "/0"), "/dev/null");
  supervisor.run([] { return std::optional<std::string>("checked"); });
}

TEST(Supervisor, FailureStopsTheOthersQuickly) {
  Harness h;
  SupervisorOptions options = h.options();
  options.grace = milliseconds(3000);
  Supervisor supervisor(options);
  supervisor.start({shell(0, "sleep 60"), shell(1, "exit 3")});
  Stopwatch watch;
  const SupervisorOutcome outcome = supervisor.run();
  EXPECT_LT(watch.seconds(), 4.0);
  EXPECT_FALSE(outcome.ok());
  ASSERT_TRUE(outcome.first_failure);
  EXPECT_EQ(outcome.first_failure->rank, 1);
  EXPECT_FALSE(outcome.first_failure->signaled);
  EXPECT_EQ(outcome.first_failure->code, 3);
  EXPECT_EQ(outcome.first_failure->describe(),
            "rank 1 (pid " + std::to_string(supervisor.pids()[1]) + ") exited with code 3");
  const WorkerExit& stopped = exitOf(outcome, 0);
  EXPECT_TRUE(stopped.stopped);
  EXPECT_TRUE(stopped.signaled);
  EXPECT_EQ(stopped.code, SIGTERM);
}

TEST(Supervisor, DescribesAWorkerKilledBySignal) {
  Harness h;
  Supervisor supervisor(h.options());
  supervisor.start({shell(2, "kill -9 $$")});
  const SupervisorOutcome outcome = supervisor.run();
  ASSERT_TRUE(outcome.first_failure);
  EXPECT_TRUE(outcome.first_failure->signaled);
  EXPECT_EQ(outcome.first_failure->code, 9);
  EXPECT_EQ(
      outcome.first_failure->describe(),
      "rank 2 (pid " + std::to_string(supervisor.pids()[0]) + ") was killed by signal 9 (SIGKILL)");
}

TEST(Supervisor, WorkerIgnoringSigtermIsKilledAfterGrace) {
  TempDir dir;
  const std::string ready = dir.path() + "/ready";
  Harness h;
  SupervisorOptions options = h.options();
  options.grace = milliseconds(300);
  Supervisor supervisor(options);
  supervisor.start({shell(0, "trap '' TERM; touch " + ready + "; sleep 60"),
                    shell(1, waitFor(ready) + "exit 1")});
  Stopwatch watch;
  const SupervisorOutcome outcome = supervisor.run();
  EXPECT_GE(watch.seconds(), 0.3);
  EXPECT_LT(watch.seconds(), 3.0);
  ASSERT_TRUE(outcome.first_failure);
  EXPECT_EQ(outcome.first_failure->rank, 1);
  const WorkerExit& killed = exitOf(outcome, 0);
  EXPECT_TRUE(killed.stopped);
  EXPECT_TRUE(killed.signaled);
  EXPECT_EQ(killed.code, SIGKILL);
}

TEST(Supervisor, ExternalCheckMessageStopsEveryone) {
  Harness h;
  Supervisor supervisor(h.options());
  supervisor.start({shell(0, "sleep 60"), shell(1, "sleep 60")});
  int calls = 0;
  const SupervisorOutcome outcome = supervisor.run([&]() -> std::optional<std::string> {
    if (++calls < 3) return std::nullopt;
    return std::string("node 1 lost its agent");
  });
  EXPECT_EQ(calls, 3);
  EXPECT_FALSE(outcome.ok());
  EXPECT_EQ(outcome.external_failure, "node 1 lost its agent");
  EXPECT_FALSE(outcome.first_failure);
  ASSERT_EQ(outcome.exits.size(), 2u);
  for (const WorkerExit& exit : outcome.exits) {
    EXPECT_TRUE(exit.stopped);
    EXPECT_EQ(exit.code, SIGTERM);
  }
}

TEST(Supervisor, AgentInterruptStopsWorkersAndHandlersAreRestored) {
  struct sigaction before {};
  ::sigaction(SIGINT, nullptr, &before);
  Harness h;
  Supervisor supervisor(h.options());
  supervisor.start({shell(0, "sleep 60")});
  const SupervisorOutcome outcome = supervisor.run([]() -> std::optional<std::string> {
    ::kill(::getpid(), SIGINT);  // as if the user pressed Ctrl-C at the agent
    return std::nullopt;
  });
  EXPECT_EQ(outcome.interrupt_signal, SIGINT);
  EXPECT_FALSE(outcome.ok());
  EXPECT_TRUE(exitOf(outcome, 0).stopped);
  struct sigaction after {};
  ::sigaction(SIGINT, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before.sa_handler);
}

TEST(Supervisor, MissingProgramThrowsLaunchErrorNamingIt) {
  Harness h;
  Supervisor in_path(h.options());
  try {
    in_path.start({WorkerLaunch{0, {"chorus-no-such-program"}, {}, {}}});
    FAIL() << "expected LaunchError";
  } catch (const LaunchError& error) {
    EXPECT_NE(error.message().find("'chorus-no-such-program'"), std::string::npos);
  }
  Supervisor by_path(h.options());
  try {
    by_path.start({WorkerLaunch{3, {"/nonexistent/chorus-worker"}, {}, {}}});
    FAIL() << "expected LaunchError";
  } catch (const LaunchError& error) {
    EXPECT_NE(error.message().find("rank 3"), std::string::npos) << error.message();
    EXPECT_NE(error.message().find("'/nonexistent/chorus-worker'"), std::string::npos);
    EXPECT_NE(error.message().find("No such file"), std::string::npos) << error.message();
  }
}

TEST(Supervisor, UnexecutableProgramFailsStartAndKillsEarlierWorkers) {
  TempDir dir;
  const std::string script = dir.path() + "/not-executable";
  std::ofstream(script) << "#!/bin/sh\n";
  Harness h;
  Supervisor supervisor(h.options());
  EXPECT_THROW(supervisor.start({shell(0, "sleep 60"), WorkerLaunch{1, {script}, {}, {}}}),
               LaunchError);
  ASSERT_EQ(supervisor.pids().size(), 1u);
  EXPECT_TRUE(processGone(supervisor.pids()[0]));
}

TEST(Supervisor, LogDirHoldsEachRanksBareOutput) {
  TempDir dir;
  const std::string logs = dir.path() + "/nested/logs";
  Harness h;
  SupervisorOptions options = h.options();
  options.log_dir = logs;
  Supervisor supervisor(options);
  supervisor.start({shell(0, "echo out0; echo err0 >&2"), shell(1, "echo out1")});
  ASSERT_TRUE(supervisor.run().ok());
  auto slurp = [](const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string log0 = slurp(logs + "/rank-0.log");
  EXPECT_NE(log0.find("out0\n"), std::string::npos) << log0;
  EXPECT_NE(log0.find("err0\n"), std::string::npos) << log0;
  EXPECT_EQ(log0.size(), 10u);
  EXPECT_EQ(slurp(logs + "/rank-1.log"), "out1\n");
}

TEST(Supervisor, NoProcessOfAStoppedWorkerGroupSurvives) {
  adoptOrphans();
  TempDir dir;
  const std::string ready = dir.path() + "/ready";
  Harness h;
  Supervisor supervisor(h.options());
  supervisor.start(
      {shell(0, "sleep 60 & touch " + ready + "; wait"), shell(1, waitFor(ready) + "exit 2")});
  const SupervisorOutcome outcome = supervisor.run();
  EXPECT_EQ(outcome.first_failure->code, 2);
  for (pid_t pid : supervisor.pids()) {
    EXPECT_TRUE(processGone(pid)) << pid;
    EXPECT_TRUE(groupGone(pid)) << pid;
  }
}

TEST(Supervisor, BackgroundChildOfASuccessfulWorkerDoesNotOutliveIt) {
  adoptOrphans();
  Harness h;
  Supervisor supervisor(h.options());
  supervisor.start({shell(0, "sleep 60 & echo done")});
  Stopwatch watch;
  const SupervisorOutcome outcome = supervisor.run();
  EXPECT_LT(watch.seconds(), 1.0);  // the sleeper holds stdout open, yet run() does not wait
  EXPECT_TRUE(outcome.ok());
  EXPECT_EQ(h.out.text(), "[rank 0] done\n");
  EXPECT_TRUE(groupGone(supervisor.pids()[0]));
}

TEST(Supervisor, DestructorKillsWorkersThatStillRun) {
  adoptOrphans();
  std::vector<pid_t> pids;
  {
    Harness h;
    Supervisor supervisor(h.options());
    supervisor.start({shell(0, "sleep 60"), shell(1, "sleep 60 & wait")});
    pids = supervisor.pids();
  }
  for (pid_t pid : pids) {
    EXPECT_TRUE(processGone(pid));
    EXPECT_TRUE(groupGone(pid));
  }
}

TEST(Supervisor, WorkersDieWhenTheAgentIsKilled) {
  adoptOrphans();  // the orphaned worker comes to us, so we can reap it and check it died
  int channel[2];
  ASSERT_EQ(::pipe(channel), 0);
  Harness h;
  const pid_t agent = ::fork();
  ASSERT_GE(agent, 0);
  if (agent == 0) {  // a stand-in agent; it must never return into the test runner
    try {
      Supervisor supervisor(h.options());
      // PR_SET_PDEATHSIG covers the worker itself, not processes it starts: exec sleep directly.
      supervisor.start({WorkerLaunch{0, {"/bin/sleep", "60"}, {}, {}}});
      const pid_t worker = supervisor.pids()[0];
      if (::write(channel[1], &worker, sizeof worker) == sizeof worker) ::pause();
    } catch (...) {
    }
    ::_exit(1);
  }
  ::close(channel[1]);
  pid_t worker = -1;
  ASSERT_EQ(::read(channel[0], &worker, sizeof worker), static_cast<ssize_t>(sizeof worker));
  ::close(channel[0]);
  ::kill(agent, SIGKILL);  // no destructor runs: only PR_SET_PDEATHSIG can take the worker down
  ASSERT_EQ(::waitpid(agent, nullptr, 0), agent);
  EXPECT_TRUE(groupGone(worker));
}

TEST(Supervisor, RejectsBadLaunches) {
  Harness h;
  EXPECT_THROW(Supervisor(h.options()).start({WorkerLaunch{0, {}, {}, {}}}), ConfigError);
  EXPECT_THROW(Supervisor(h.options()).start({shell(1, "true"), shell(1, "true")}), ConfigError);
  Supervisor not_started(h.options());
  EXPECT_THROW(not_started.run(), LaunchError);
}

}  // namespace
}  // namespace chorus::runtime
