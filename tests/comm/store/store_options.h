// Test helper: options of a TcpStoreServer on loopback and of its clients, under one job secret.
#pragma once

#include <chrono>
#include <utility>

#include "chorus/comm/store/job_secret.h"
#include "chorus/comm/store/tcp_store.h"

namespace chorus::comm::testing {

// A server on 127.0.0.1 (on a port of the system's choice) that admits holders of `secret`.
inline TcpStoreServerOptions loopbackServerOptions(JobSecret secret) {
  TcpStoreServerOptions options;
  options.host = "127.0.0.1";
  options.secret = std::move(secret);
  return options;
}

// A client of the server on `port` holding `secret`, that gives up connecting after 2 s.
inline TcpStoreOptions loopbackClientOptions(int port, JobSecret secret) {
  TcpStoreOptions options;
  options.port = port;
  options.secret = std::move(secret);
  options.connect_timeout = std::chrono::milliseconds(2000);
  return options;
}

}  // namespace chorus::comm::testing
