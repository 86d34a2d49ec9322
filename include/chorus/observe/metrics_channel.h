// The node-local channel from workers to their agent: a Unix datagram socket in a private
// directory the agent creates (mode 700), one datagram per report. Never the training
// communicator: metrics must not add collective operations or block a step. A worker's send
// never waits; when the agent lags and the socket's queue is full, the report is dropped (the
// next one carries the same running totals).
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace chorus::observe {

// The agent's end: binds a socket in a fresh private directory and receives datagrams.
// Owns the socket and the directory (removed in the destructor). Non-copyable. receive() is for
// one thread at a time; path() is safe from any thread.
class MetricsReceiver {
 public:
  // Creates the directory under `parent` (Default: the system's temporary directory) and binds.
  // Throws ConfigError when it cannot.
  explicit MetricsReceiver(const std::string& parent = "");
  ~MetricsReceiver();
  MetricsReceiver(const MetricsReceiver&) = delete;
  MetricsReceiver& operator=(const MetricsReceiver&) = delete;

  // The socket's path, handed to workers.
  const std::string& path() const { return path_; }
  // The next datagram, or nothing when none arrived within `timeout`.
  std::optional<std::string> receive(std::chrono::milliseconds timeout);

 private:
  std::string dir_;
  std::string path_;
  int fd_ = -1;
};

// A worker's end. Non-copyable; send() from one thread at a time.
class MetricsSender {
 public:
  // Throws ConfigError when `path` is not a usable socket path.
  explicit MetricsSender(const std::string& path);
  ~MetricsSender();
  MetricsSender(const MetricsSender&) = delete;
  MetricsSender& operator=(const MetricsSender&) = delete;

  // Sends one datagram without waiting. False when it was dropped (the agent is gone or its
  // queue is full).
  bool send(const std::string& message);
  // Datagrams dropped so far.
  long dropped() const { return dropped_; }

 private:
  std::string path_;
  int fd_ = -1;
  long dropped_ = 0;
};

}  // namespace chorus::observe
