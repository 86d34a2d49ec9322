// Where the job secret lives while a job runs: not in any process's environment or command line
// (which every process of the user can read in /proc), and not in a descriptor the workers keep.
// A real `chorus run` with real workers; the test reads /proc like any other process could.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

namespace {

std::string readWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The NUL-separated entries of /proc/PID/environ (empty if unreadable).
std::vector<std::string> environOf(const std::string& pid) {
  std::vector<std::string> entries;
  std::string all = readWhole("/proc/" + pid + "/environ");
  for (std::size_t start = 0; start < all.size();) {
    std::size_t end = all.find('\0', start);
    if (end == std::string::npos) end = all.size();
    entries.push_back(all.substr(start, end - start));
    start = end + 1;
  }
  return entries;
}

std::string valueOf(const std::vector<std::string>& variables, const std::string& name) {
  for (const std::string& entry : variables)
    if (entry.rfind(name + "=", 0) == 0) return entry.substr(name.size() + 1);
  return "";
}

// A running `chorus run ... -- test_worker sleep`: the agent's pid and its workers' pids, read
// from their output. Stopped (SIGTERM to the agent) by the destructor.
class RunningJob {
 public:
  explicit RunningJob(const std::string& run_args) {
    const std::string command =
        std::string(CHORUS_BINARY) + " run " + run_args + " -- " + CHORUS_TEST_WORKER + " sleep";
    int out[2];
    EXPECT_EQ(pipe(out), 0);
    agent_ = fork();
    if (agent_ == 0) {
      dup2(out[1], 1);
      dup2(out[1], 2);
      execl("/bin/sh", "sh", "-c", ("exec " + command).c_str(), nullptr);
      _exit(127);
    }
    close(out[1]);
    out_ = out[0];
    const std::regex pid_line("pid=([0-9]+)");
    char buffer[4096];
    while (workers_.size() < 2) {
      const ssize_t got = read(out_, buffer, sizeof buffer);
      if (got <= 0) break;
      output_.append(buffer, got);
      workers_.clear();
      for (auto it = std::sregex_iterator(output_.begin(), output_.end(), pid_line);
           it != std::sregex_iterator(); ++it)
        workers_.push_back((*it)[1]);
    }
  }
  ~RunningJob() {
    kill(agent_, SIGTERM);
    waitpid(agent_, nullptr, 0);
    close(out_);
  }
  std::string agent() const { return std::to_string(agent_); }
  const std::vector<std::string>& workers() const { return workers_; }
  const std::string& output() const { return output_; }

 private:
  pid_t agent_ = -1;
  int out_ = -1;
  std::string output_;
  std::vector<std::string> workers_;
};

// Every /proc/*/environ and cmdline this test may read that contains `needle`.
std::vector<std::string> processesHolding(const std::string& needle) {
  std::vector<std::string> found;
  DIR* proc = opendir("/proc");
  while (dirent* entry = readdir(proc)) {
    const std::string pid = entry->d_name;
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    for (const char* file : {"environ", "cmdline"})
      if (readWhole("/proc/" + pid + "/" + file).find(needle) != std::string::npos)
        found.push_back(pid + "/" + file);
  }
  closedir(proc);
  return found;
}

// What descriptor `fd` of process `pid` refers to ("pipe:[INODE]", "socket:[INODE]", a path),
// or "" when it is closed.
std::string descriptorTarget(const std::string& pid, const std::string& fd) {
  char target[256];
  const ssize_t length =
      readlink(("/proc/" + pid + "/fd/" + fd).c_str(), target, sizeof target - 1);
  return length < 0 ? "" : std::string(target, static_cast<size_t>(length));
}

// Whether `fd` of `pid` is still the secret's pipe: the read end of a pipe that no other
// descriptor of the worker holds (its write end was closed before the worker started). Once the
// worker closed it, the number may be taken again by what it opens next (its communicator's
// sockets and wake-up pipe, both of whose ends it holds), so an open descriptor alone says
// nothing.
bool holdsInheritedPipeEnd(const std::string& pid, const std::string& fd) {
  const std::string target = descriptorTarget(pid, fd);
  if (target.rfind("pipe:", 0) != 0) return false;
  DIR* fds = opendir(("/proc/" + pid + "/fd").c_str());
  int ends = 0;
  while (dirent* entry = readdir(fds))
    if (entry->d_name[0] != '.' && descriptorTarget(pid, entry->d_name) == target) ++ends;
  closedir(fds);
  return ends == 1;
}

TEST(SecretMultiproc, NoProcessEnvironmentHoldsTheSecretFile) {
  const std::string secret = "environ-test-secret-" + std::to_string(getpid()) + "-0123456789";
  const std::string file = testing::TempDir() + "/environ_test.secret";
  std::ofstream(file) << secret;
  ASSERT_EQ(chmod(file.c_str(), 0600), 0);
  RunningJob job("--devices cpu,cpu --secret-file " + file);
  ASSERT_EQ(job.workers().size(), 2u) << job.output();
  for (const std::string& pid : job.workers()) {
    const std::vector<std::string> variables = environOf(pid);
    // The check means something: we can read the worker's environment, and it is a worker.
    ASSERT_NE(valueOf(variables, "CHORUS_RANK"), "") << "cannot read /proc/" << pid << "/environ";
    const std::string fd = valueOf(variables, "CHORUS_SECRET_FD");
    ASSERT_NE(fd, "");
    EXPECT_EQ(valueOf(variables, "CHORUS_JOB_SECRET"), "");
    // The worker read the pipe and closed it: nothing it starts can inherit the secret.
    EXPECT_FALSE(holdsInheritedPipeEnd(pid, fd)) << "fd " << fd << " is still the secret's pipe";
  }
  EXPECT_EQ(processesHolding(secret), std::vector<std::string>{}) << job.output();
}

TEST(SecretMultiproc, NoProcessEnvironmentHoldsAGeneratedSecret) {
  RunningJob job("--devices cpu,cpu");
  ASSERT_EQ(job.workers().size(), 2u) << job.output();
  // A generated secret is 64 hex characters; no variable of the agent or a worker is one.
  const std::regex generated("^[0-9a-f]{64}$");
  std::vector<std::string> pids = job.workers();
  pids.push_back(job.agent());
  for (const std::string& pid : pids) {
    const std::vector<std::string> variables = environOf(pid);
    ASSERT_FALSE(variables.empty()) << "cannot read /proc/" << pid << "/environ";
    for (const std::string& entry : variables) {
      const std::size_t equals = entry.find('=');
      EXPECT_FALSE(std::regex_match(entry.substr(equals + 1), generated))
          << "pid " << pid << ": " << entry.substr(0, equals) << " holds a secret";
    }
  }
}

}  // namespace
