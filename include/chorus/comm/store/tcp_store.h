// The job's rendezvous store over TCP, authenticated by the job secret.
//
// One TcpStoreServer per job (hosted by the agent on the first node) keeps the job's state in a
// MemoryStore; every worker reaches it through a TcpStore client. Both ends prove that they know
// the job secret by HMAC challenge–response before any request, and then every frame carries a
// sequence number and an HMAC under a key of that connection alone, so a modified, injected,
// replayed or reordered frame ends the connection with AuthError before it can change anything
// (the wire format is described in src/comm/store_protocol.h; the threat model in
// docs/security.md). The secret never crosses the network. A peer that is not a chorus store (a
// web server, a c10d TCPStore) is recognised at once and reported as ProtocolError. Keys, values,
// frames and connections are bounded, so no peer can make the server allocate or spawn without
// limit.
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

#include "chorus/comm/store/job_secret.h"
#include "chorus/comm/store/memory_store.h"
#include "chorus/comm/store/store.h"

namespace chorus::comm {

namespace wire {
enum class Op : std::uint8_t;
class Reader;
class Socket;
class StoreChannel;
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
  // Bound on sending one reply to a client that stopped reading, and on receiving the rest of a
  // request once its first byte arrived (a client that stops mid-frame is dropped). An idle
  // authenticated client is never dropped for idleness. Default: 5 min.
  std::chrono::milliseconds io_timeout = std::chrono::minutes(5);
  // Authenticated connections served at once; one more is refused at the end of its handshake
  // (its client throws CommError). `chorus run` sets the job's ranks + agents +
  // kStoreConnectionMargin. REQUIRES: >= 1. Default: 4096.
  int max_connections = 4096;
  // Connections still in their handshake at once. When one more arrives, one of them is dropped:
  // the oldest whose peer has already closed or reset its end (its handshake can only fail), else
  // the oldest. So a flood of connections that never authenticate costs one thread per pending
  // connection at most, cannot keep a worker out for long, and a flood of connections that close
  // again (a port scanner, garbage senders) never drops a worker in its handshake.
  // REQUIRES: >= 1. Default: 64.
  int max_pending_handshakes = 64;
};

// Connections beyond the job's ranks and agents that its store accepts: room for a client that
// reconnects before the server noticed that its previous connection closed.
constexpr int kStoreConnectionMargin = 8;

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
  // Changes options.max_connections, e.g. once the job's size is known; connections already
  // served stay. REQUIRES: >= 1. Thread-safe.
  void setMaxConnections(int max_connections);
  // Authenticated connections being served now.
  int connections() const;
  // Stops serving; idempotent. Returns once every thread has been joined.
  void stop();

 private:
  struct Connection;

  void listen();
  void acceptLoop();
  // Takes one connection from the kernel's queue; false when the queue is empty or accept failed.
  bool acceptOne();
  // REQUIRES: connections_mutex_ held. Drops one connection still in its handshake (which one:
  // TcpStoreServerOptions::max_pending_handshakes).
  void evictPendingLocked();
  void reapFinished();
  void serve(Connection& connection);
  void serveRequests(wire::StoreChannel& channel);
  // The handshake; returns the authenticated channel, or null when the peer was refused.
  std::unique_ptr<wire::StoreChannel> authenticate(Connection& connection);
  // Whether a warning about a refused or dropped peer may be logged now (one a second at most).
  bool warningAllowed();
  // Executes one request; returns the reply payload. Throws ProtocolError on a malformed request.
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
  mutable std::mutex connections_mutex_;
  std::list<std::unique_ptr<Connection>> connections_;  // in order of arrival
  int pending_ = 0;                                     // guarded by connections_mutex_
  int served_ = 0;                                      // guarded by connections_mutex_
  std::int64_t evicted_ = 0;                            // guarded by connections_mutex_
  std::atomic<std::int64_t> next_warning_millis_{0};
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
// secret mismatch, ProtocolError when the endpoint is not a chorus store, CommError when the
// server already serves all the connections the job may have, TimeoutError when it cannot
// connect within connect_timeout). Thread-safe: one connection, one request at a time (a thread
// blocked in get holds it; give threads that block for long their own TcpStore). A key over
// 4 KiB or a value over 64 MiB is a ConfigError, before anything is sent. After a lost
// connection the call throws CommError naming the endpoint (AuthError when a frame in either
// direction failed authentication), and the next call reconnects with fresh keys.
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
  // REQUIRES: mutex_ held.
  void disconnectLocked();
  // Authenticates over socket_ and sets channel_; false when the server is full.
  bool handshake();
  // Sends `request` and returns the reply's fields after an OK status; `wait` is how long the
  // server may legitimately hold the request. Throws the error the reply's status means.
  wire::Reader roundTrip(Bytes request, std::chrono::milliseconds wait, const char* operation);
  wire::Reader exchangeLocked(const Bytes& request, std::chrono::milliseconds wait,
                              const char* operation);
  // Throws ConfigError naming `operation` when `key` (or `value`) is over the protocol's limits.
  void checkLimits(const char* operation, const std::string& key, const Bytes* value = nullptr,
                   const Bytes* other = nullptr) const;

  TcpStoreOptions options_;
  std::mutex mutex_;
  std::unique_ptr<wire::Socket> socket_;         // null while disconnected
  std::unique_ptr<wire::StoreChannel> channel_;  // over socket_; null while disconnected
};

}  // namespace chorus::comm
