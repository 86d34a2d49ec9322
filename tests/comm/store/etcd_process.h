// Test helper: a real etcd server (Debian's etcd-server, which scripts/setup installs) on free
// loopback ports in a fresh data directory, started by the test and stopped with it.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "chorus/comm/store/etcd_store.h"
#include "chorus/core/error.h"

namespace chorus::comm::testing {

// A port no one listens on now (the kernel's choice for a socket bound to port 0).
inline int freeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

// Why etcd cannot run here, or "" when it can. scripts/setup installs Debian's etcd-server, so
// its absence is a broken setup: a failure, never a skip.
inline std::string etcdMissing() {
  if (std::system("command -v etcd >/dev/null 2>&1") == 0) return "";
  return "etcd is not installed; scripts/setup installs Debian's etcd-server";
}

// Fails the test when etcd cannot run. In a test body or a fixture's SetUp (a failure there keeps
// the body from running).
#define CHORUS_REQUIRE_ETCD()                                                \
  do {                                                                       \
    const std::string etcd_missing = ::chorus::comm::testing::etcdMissing(); \
    ASSERT_TRUE(etcd_missing.empty()) << etcd_missing;                       \
  } while (false)

// One etcd member on 127.0.0.1. Owns the process (SIGTERM, then reaped) and its data directory.
class EtcdProcess {
 public:
  EtcdProcess() {
    client_port_ = freeLoopbackPort();
    const int peer_port = freeLoopbackPort();
    dir_ = ::testing::TempDir() + "/etcd-" + std::to_string(::getpid()) + "-" +
           std::to_string(client_port_);
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    const std::string client = "http://127.0.0.1:" + std::to_string(client_port_);
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port);
    std::vector<std::string> args = {"etcd",         "--name",
                                     "test",         "--data-dir",
                                     dir_ + "/data", "--listen-client-urls",
                                     client,         "--advertise-client-urls",
                                     client,         "--listen-peer-urls",
                                     peer,           "--initial-advertise-peer-urls",
                                     peer,           "--initial-cluster",
                                     "test=" + peer, "--logger",
                                     "zap",          "--log-outputs",
                                     "stderr"};
    const std::string log = dir_ + "/etcd.log";
    pid_ = ::fork();
    if (pid_ == 0) {
      // Its log in the data directory's parent, out of the test's output.
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (fd >= 0) {
        ::dup2(fd, STDOUT_FILENO);
        ::dup2(fd, STDERR_FILENO);
      }
      std::vector<char*> argv;
      for (std::string& arg : args) argv.push_back(arg.data());
      argv.push_back(nullptr);
      ::execvp("etcd", argv.data());
      ::_exit(127);
    }
    // Ready once it answers a request.
    EtcdStore probe(options("/probe/"));
    probe.numKeys();
  }
  ~EtcdProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
    std::filesystem::remove_all(dir_);
  }
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  std::string endpoint() const { return "127.0.0.1:" + std::to_string(client_port_); }
  // A client of this etcd under `prefix`, giving up on reaching it after 10 s.
  EtcdStoreOptions options(const std::string& prefix) const {
    EtcdStoreOptions options;
    options.endpoints = {endpoint()};
    options.prefix = prefix;
    options.connect_timeout = std::chrono::seconds(10);
    return options;
  }

 private:
  int client_port_ = 0;
  pid_t pid_ = -1;
  std::string dir_;
};

}  // namespace chorus::comm::testing
