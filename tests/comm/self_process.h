// Test helper: this test binary started again as a peer process, running the one test `filter`
// selects, with `variable=value` added to its environment (how the peer learns the store's
// address and its rank).
#pragma once

#include <unistd.h>

#include <string>
#include <vector>

extern char** environ;

namespace chorus::comm::testing {

// Returns the peer's pid (-1 when fork failed); its exit status says whether its test passed.
inline pid_t startSelf(const std::string& variable, const std::string& value,
                       const std::string& filter) {
  // Everything exec needs is built before fork: the child may only call exec.
  std::vector<std::string> variables;
  for (char** entry = environ; *entry; ++entry) variables.emplace_back(*entry);
  variables.push_back(variable + "=" + value);
  std::vector<char*> envp;
  for (auto& each : variables) envp.push_back(each.data());
  envp.push_back(nullptr);
  std::string self = "/proc/self/exe";
  std::string selected = "--gtest_filter=" + filter;
  char* argv[] = {self.data(), selected.data(), nullptr};
  const pid_t pid = fork();
  if (pid == 0) {
    execve(self.c_str(), argv, envp.data());
    _exit(127);
  }
  return pid;
}

}  // namespace chorus::comm::testing
