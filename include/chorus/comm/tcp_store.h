// The job's rendezvous store over TCP, authenticated by the job secret.
//
// One TcpStoreServer per job (hosted by the agent on the first node) keeps the job's state in a
// MemoryStore; every worker reaches it through a TcpStore client. Both ends prove that they know
// the job secret by HMAC challenge–response before any request (the wire format is described in
// src/comm/store_protocol.h); the secret never crosses the network. A peer that is not a chorus
// store (a web server, a c10d TCPStore) is recognised at once and reported as ProtocolError.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "chorus/comm/job_secret.h"
#include "chorus/comm/memory_store.h"
#include "chorus/comm/store.h"

namespace chorus::comm {

namespace wire {
enum class Op : std::uint8_t;
class Reader;
class Socket;
}  // namespace wire

struct TcpStoreServerOptions {
  // Address to listen on. Default: "0.0.0.0" (all IPv4 interfaces).
  std::string host = "0.0.0.0";
  // Port to listen on; 0 picks a free one (read it back with port()). Default: 0.
  int port = 0;
  // REQUIRES: non-empty. Clients must prove they know it.
  JobSecret secret;
  // How long a new connection may take to authenticate before it is dropped, so scanners and
  // silent peers cannot pile up. Default: 5 s.
  std::chrono::milliseconds handshake_timeout = std::chrono::seconds(5);
  // Bound on sending one reply to a client that stopped reading. Default: 5 min.
  std::chrono::milliseconds io_timeout = std::chrono::minutes(5);
};

// Hosts the job's store. Listens in the constructor (throws CommError if it cannot) and serves in
// background threads: one accepting, one per client connection (jobs have at most a few thousand
// workers). Owns its state, its sockets and its threads; stop() or the destructor closes every
// connection (clients blocked in get see CommError) and joins every thread promptly.
// Thread-safe; not copyable.
class TcpStoreServer {
 public:
  explicit TcpStoreServer(TcpStoreServerOptions options);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // The bound port (the ephemeral one when options.port was 0).
  int port() const { return port_; }
  // "host:port" as bound.
  std::string endpoint() const;
  // Stops serving; idempotent. Returns once every thread has been joined.
  void stop();

 private:
  struct Connection;

  void listen();
  void acceptLoop();
  void acceptOne();
  void reapFinished();
  void serve(Connection& connection);
  bool authenticate(wire::Socket& socket);
  // Executes one request; returns the reply frame. Throws ProtocolError on a malformed request.
  Bytes execute(const Bytes& request);
  // get and wait block this connection's thread on the shared state, up to the request's timeout.
  Bytes executeGet(wire::Reader& in);
  Bytes executeWait(wire::Reader& in);
  Bytes executeImmediate(wire::Op op, wire::Reader& in);

  TcpStoreServerOptions options_;
  int listen_fd_ = -1;
  int port_ = 0;
  MemoryStore state_;
  std::atomic<bool> stopping_{false};
  std::mutex stop_mutex_;  // serialises stop() callers
  std::mutex connections_mutex_;
  std::list<std::unique_ptr<Connection>> connections_;
  std::thread accept_thread_;
};

struct TcpStoreOptions {
  // The server's host name or address. Default: "127.0.0.1".
  std::string host = "127.0.0.1";
  // The server's port. REQUIRES: 1..65535.
  int port = 0;
  // REQUIRES: non-empty; the job's secret, the same the server holds.
  JobSecret secret;
  // How long to keep retrying to connect (with backoff), because workers may start before the
  // server listens. Default: 30 s.
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(30);
  // Bound on every socket read and write, so a dead server never hangs a client. A get or wait
  // waits its own timeout plus a margin of min(io_timeout, 30 s). Default: 5 min.
  std::chrono::milliseconds io_timeout = std::chrono::minutes(5);
  // How long the server may take to greet us; a peer that stays silent is not a chorus store
  // (a c10d TCPStore waits for the client to speak first). Default: 10 s.
  std::chrono::milliseconds handshake_timeout = std::chrono::seconds(10);
};

// A client of TcpStoreServer. Connects and authenticates in the constructor (throws AuthError on a
// secret mismatch, ProtocolError when the endpoint is not a chorus store, TimeoutError when it
// cannot connect within connect_timeout). Thread-safe: one connection, one request at a time (a
// thread blocked in get holds it; give threads that block for long their own TcpStore). After a
// lost connection the call throws CommError naming the endpoint, and the next call reconnects.
class TcpStore : public Store {
 public:
  explicit TcpStore(TcpStoreOptions options);
  ~TcpStore() override;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool deleteKey(const std::string& key) override;
  std::int64_t numKeys() override;

  // "host:port" of the server.
  std::string endpoint() const;

 private:
  // REQUIRES: mutex_ held. Connects (with retries) and authenticates.
  void connectLocked();
  void handshake(wire::Socket& socket);
  // Sends `frame` and returns the reply's fields after an OK status; `wait` is how long the server
  // may legitimately hold the request. Throws the error the reply's status means.
  wire::Reader roundTrip(Bytes frame, std::chrono::milliseconds wait, const char* operation);
  wire::Reader exchangeLocked(const Bytes& frame, std::chrono::milliseconds wait,
                              const char* operation);

  TcpStoreOptions options_;
  std::mutex mutex_;
  std::unique_ptr<wire::Socket> socket_;
};

}  // namespace chorus::comm
