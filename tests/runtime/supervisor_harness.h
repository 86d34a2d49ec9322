// Test helper: a Supervisor whose workers are shell snippets and whose output goes to temporary
// files, for the supervisor's own tests and those of the elastic launch layer.
#pragma once

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>

#include "chorus/runtime/launch/supervisor.h"

namespace chorus::runtime::testing {

// A fresh directory, removed with everything in it at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "supervisor-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// An anonymous temporary file standing in for the agent's stdout or stderr.
class Capture {
 public:
  Capture() : file_(::tmpfile()) {}
  ~Capture() { ::fclose(file_); }
  int fd() const { return ::fileno(file_); }
  std::string text() const {
    std::string text;
    char buffer[4096];
    ssize_t n;
    for (off_t offset = 0; (n = ::pread(fd(), buffer, sizeof buffer, offset)) > 0; offset += n)
      text.append(buffer, static_cast<std::size_t>(n));
    return text;
  }

 private:
  FILE* file_;
};

inline WorkerLaunch shell(int rank, const std::string& script,
                          std::map<std::string, std::string> env = {}) {
  return WorkerLaunch{rank, {"/bin/sh", "-c", script}, std::move(env), {}};
}

// Supervisor options for tests: output captured, short grace and poll interval.
struct Harness {
  Capture out;
  Capture err;
  SupervisorOptions options() const {
    SupervisorOptions options;
    options.grace = std::chrono::milliseconds(1000);
    options.poll_interval = std::chrono::milliseconds(50);
    options.stdout_fd = out.fd();
    options.stderr_fd = err.fd();
    return options;
  }
};

inline const WorkerExit& exitOf(const SupervisorOutcome& outcome, int rank) {
  for (const WorkerExit& exit : outcome.exits)
    if (exit.rank == rank) return exit;
  throw std::runtime_error("no exit recorded for rank " + std::to_string(rank));
}

// Shell snippet that waits until `file` exists, so a test can order events across workers.
inline std::string waitFor(const std::string& file) {
  return "while [ ! -e " + file + " ]; do sleep 0.02; done; ";
}

}  // namespace chorus::runtime::testing
