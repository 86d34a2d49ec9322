#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <memory>
#include <system_error>
#include <thread>
#include <utility>

#include "chorus/comm/store/tcp_store.h"
#include "chorus/core/error.h"
#include "chorus/core/logging.h"
#include "store/store_channel.h"
#include "store/store_protocol.h"

namespace chorus::comm {
namespace {

using wire::Status;

// How often the accept thread looks at the stop flag (stop() also wakes it at once) and reaps
// the threads of finished connections.
constexpr int kAcceptPollMillis = 50;
// At most one warning about refused or dropped peers per this many milliseconds, so that a flood
// of them can neither flood the log nor slow the server down writing it.
constexpr std::int64_t kWarningEveryMillis = 1000;
// How long a refused peer has to read why before its connection is closed.
constexpr int kLingerMillis = 200;
// Connections taken from the kernel's queue per wake-up of the accept thread, before it reaps
// finished ones again.
constexpr int kAcceptBatch = 256;
// How long stop() lets handlers finish the reply they are writing before it cuts every
// connection. A reply is small (but for a large get's value), so this bound is rarely reached.
constexpr int kStopGraceMillis = 1000;

std::string describePeer(const sockaddr_storage& address) {
  char host[NI_MAXHOST] = "?";
  char port[NI_MAXSERV] = "?";
  ::getnameinfo(reinterpret_cast<const sockaddr*>(&address), sizeof(address), host, sizeof(host),
                port, sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV);
  return std::string("client ") + host + ":" + port;
}

// Whether the peer has closed or reset its end of socket `fd` (read without consuming anything, so
// it does not race the thread serving the connection). Such a peer cannot finish a handshake.
bool peerHungUp(int fd) {
  pollfd entry{fd, POLLRDHUP, 0};
  return ::poll(&entry, 1, 0) > 0 && (entry.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

// Whether a connection just taken from the kernel's queue can be closed at once, unread: its
// peer has closed or reset its end and sent nothing that could begin a handshake (nothing, or
// bytes that are not the start of the magic). A peer that sent the magic and then half-closed
// still gets its thread, which reads what it sent (the store_server fuzz target is such a peer).
bool goneBeforeGreeting(int fd) {
  if (!peerHungUp(fd)) return false;
  char head[wire::kMagicBytes];
  ssize_t got = ::recv(fd, head, sizeof(head), MSG_PEEK | MSG_DONTWAIT);
  if (got <= 0) return true;
  return std::memcmp(head, wire::kMagic, static_cast<std::size_t>(got)) != 0;
}

wire::Writer startReply(Status status) {
  wire::Writer out;
  out.u8(static_cast<std::uint8_t>(status));
  return out;
}

}  // namespace

// A client connection and the thread serving it. The socket is closed only after the thread is
// joined, so stop() and eviction can shut it down without racing a reused descriptor.
struct TcpStoreServer::Connection {
  enum class State { kHandshake, kServed, kEvicted, kClosed };
  std::unique_ptr<wire::Socket> socket;
  std::thread thread;
  State state = State::kHandshake;  // guarded by connections_mutex_
  std::atomic<bool> finished{false};
};

TcpStoreServer::TcpStoreServer(TcpStoreServerOptions options) : options_(std::move(options)) {
  CHORUS_CHECK_CONFIG(!options_.secret.empty(), "the store server needs the job secret");
  CHORUS_CHECK_CONFIG(options_.port >= 0 && options_.port <= 65535, "store port ", options_.port,
                      " is out of range");
  CHORUS_CHECK_CONFIG(options_.max_connections >= 1, "the store's max_connections must be >= 1");
  CHORUS_CHECK_CONFIG(options_.max_pending_handshakes >= 1,
                      "the store's max_pending_handshakes must be >= 1");
  listen();
  logInfo("store: listening on ", endpoint(), " (job secret ", options_.secret.fingerprint(), ")");
  // Last: nothing after it may throw, or the joinable accept thread would be destroyed unjoined
  // (std::terminate), since a constructor that throws runs no destructor.
  accept_thread_ = std::thread([this] { acceptLoop(); });
}

TcpStoreServer::~TcpStoreServer() { stop(); }

std::string TcpStoreServer::endpoint() const { return wire::formatEndpoint(options_.host, port_); }

void TcpStoreServer::setMaxConnections(int max_connections) {
  CHORUS_CHECK_CONFIG(max_connections >= 1, "the store's max_connections must be >= 1");
  std::lock_guard<std::mutex> lock(connections_mutex_);
  options_.max_connections = max_connections;
}

int TcpStoreServer::connections() const {
  std::lock_guard<std::mutex> lock(connections_mutex_);
  return served_;
}

void TcpStoreServer::stop() {
  std::lock_guard<std::mutex> stop_lock(stop_mutex_);
  stopping_ = true;
  // Wakes the accept thread's poll at once (Linux: a listening socket shut down reads as hung
  // up), so that stop() returns in microseconds rather than after up to kAcceptPollMillis.
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
  if (accept_thread_.joinable()) accept_thread_.join();
  state_.close();  // wakes handlers blocked in get/wait
  std::list<std::unique_ptr<Connection>> connections;
  {
    std::lock_guard<std::mutex> lock(connections_mutex_);
    connections.swap(connections_);
  }
  // Reads first: an idle handler reads end of stream and ends, while one writing its reply
  // finishes it. A request applied just before stop() (the last "done" of a job, whose waiter is
  // what stops this server) must still be answered, or its client sees a lost store.
  for (auto& connection : connections) connection->socket->shutdownRead();
  const Deadline grace = deadlineFor(Millis(kStopGraceMillis));
  for (auto& connection : connections)
    while (!connection->finished && !grace.expired())
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  for (auto& connection : connections) connection->socket->shutdown();
  for (auto& connection : connections) connection->thread.join();
  connections.clear();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

void TcpStoreServer::listen() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  std::string where = wire::formatEndpoint(options_.host, options_.port);
  int rc =
      ::getaddrinfo(options_.host.c_str(), std::to_string(options_.port).c_str(), &hints, &found);
  if (rc != 0) {
    CHORUS_THROW(CommError, "cannot resolve store address ", where, ": ", gai_strerror(rc));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> addresses(found, freeaddrinfo);
  std::string error;
  for (const addrinfo* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    // Non-blocking, so that the accept thread can take all queued connections at each wake-up.
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) {
      listen_fd_ = fd;
    } else {
      error = std::strerror(errno);
      ::close(fd);
    }
  }
  if (listen_fd_ < 0) CHORUS_THROW(CommError, "the store cannot listen on ", where, ": ", error);
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &length);
  port_ =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
}

void TcpStoreServer::acceptLoop() {
  while (!stopping_) {
    pollfd entry{listen_fd_, POLLIN, 0};
    int rc = ::poll(&entry, 1, kAcceptPollMillis);
    try {
      for (int i = 0; rc > 0 && i < kAcceptBatch && !stopping_ && acceptOne(); ++i) {
      }
    } catch (const std::exception& error) {
      // E.g. bad_alloc: lose this connection, never the server (an exception leaving this thread
      // would end the process).
      logWarn("store: cannot take a connection: ", error.what());
    }
    reapFinished();
  }
}

bool TcpStoreServer::acceptOne() {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length, SOCK_CLOEXEC);
  if (fd < 0) {
    // Transient (the peer gave up, or we are out of descriptors for a moment): keep serving,
    // but pause so that a persistent error such as EMFILE does not spin this thread.
    if (errno == EINTR || errno == ECONNABORTED) return true;  // others may be queued
    if (errno != EAGAIN) {
      logWarn("store: accept failed: ", std::strerror(errno));
      std::this_thread::sleep_for(Millis(kAcceptPollMillis));
    }
    return false;
  }
  // A peer that is gone and sent nothing of a handshake (a port scanner; a flood's connection
  // that waited in the kernel's queue while the server was busy) gets neither a thread nor a
  // pending slot. Under a flood faster than the server, nearly every queued connection is such a
  // one: closed at the cost of a few system calls, they drain the queue quickly, and a worker that
  // connected behind them is greeted within its handshake timeout. (Each one once cost a thread:
  // under TSan the server then fell to tens of connections a second, and a worker behind
  // thousands of queued ones waited past its handshake timeout.)
  if (goneBeforeGreeting(fd)) {
    ::close(fd);
    return true;
  }
  wire::configureSocket(fd);
  auto connection = std::make_unique<Connection>();
  connection->socket = std::make_unique<wire::Socket>(fd, describePeer(address));
  Connection& ref = *connection;
  std::lock_guard<std::mutex> lock(connections_mutex_);
  if (pending_ >= options_.max_pending_handshakes) evictPendingLocked();
  connections_.push_back(std::move(connection));
  try {
    ref.thread = std::thread([this, &ref] { serve(ref); });
  } catch (const std::system_error& error) {
    // Out of threads: refuse this one connection rather than lose the server.
    logWarn("store: cannot serve ", ref.socket->peer(), ": ", error.what());
    connections_.pop_back();
    return true;
  }
  ++pending_;
  return true;
}

void TcpStoreServer::evictPendingLocked() {
  // A worker stays connected through its handshake; a peer that closed or reset its end can only
  // fail it. Dropping those first keeps a flood of connections that close again from pushing a
  // worker out mid-handshake. Dropping the oldest regardless did, in 2 of 8 runs under ASan's
  // slowdown: an arrival dropped the worker before its answer came, and its retries met the same
  // flood until connect_timeout. Only when no pending peer has hung up does the oldest go, so
  // silent connections still cannot hold the slots.
  Connection* victim = nullptr;
  for (auto& connection : connections_) {
    if (connection->state != Connection::State::kHandshake) continue;
    if (victim == nullptr) victim = connection.get();  // the oldest, if no peer has hung up
    if (peerHungUp(connection->socket->fd())) {
      victim = connection.get();
      break;
    }
  }
  if (victim == nullptr) return;
  victim->state = Connection::State::kEvicted;
  --pending_;
  victim->socket->shutdown();  // its thread sees the connection fail and ends
  ++evicted_;
  if (warningAllowed()) {
    logWarn("store: ", evicted_, " connection(s) dropped in their handshake so far, because ",
            options_.max_pending_handshakes,
            " others were pending (a connection flood?); latest: ", victim->socket->peer());
  }
}

void TcpStoreServer::reapFinished() {
  std::list<std::unique_ptr<Connection>> finished;
  {
    std::lock_guard<std::mutex> lock(connections_mutex_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      auto next = std::next(it);
      if ((*it)->finished) finished.splice(finished.end(), connections_, it);
      it = next;
    }
  }
  for (auto& connection : finished) connection->thread.join();
}

void TcpStoreServer::serve(Connection& connection) {
  wire::Socket& socket = *connection.socket;
  std::unique_ptr<wire::StoreChannel> channel;
  // The last word to an authenticated peer before we close: why (it cannot be trusted further).
  auto refuse = [&](Status status, const std::string& message) {
    if (!channel) return;
    try {
      channel->send(startReply(status).str(message).payload(), deadlineFor(options_.io_timeout));
      socket.finish(Millis(kLingerMillis));
    } catch (const std::exception&) {
      // The peer is being dropped anyway (and nothing may leave this thread: std::terminate).
    }
  };
  try {
    channel = authenticate(connection);
    if (channel) serveRequests(*channel);
  } catch (const AuthError& error) {
    logWarn("store: dropping ", socket.peer(), ": ", error.message());
    refuse(Status::kAuthFailed, error.message());
  } catch (const ProtocolError& error) {
    logWarn("store: dropping ", socket.peer(), ": ", error.message());
    refuse(Status::kBadRequest, error.message());
  } catch (const TimeoutError& error) {
    // Mid-request: a peer that stopped mid-frame. In the handshake: a silent or slow peer, logged
    // at debug level because a flood of them must not flood the log.
    if (channel)
      logWarn("store: dropping ", socket.peer(), ": it stopped in the middle of a request");
    else
      logDebug("store: dropping ", socket.peer(), ": ", error.message());
  } catch (const Error& error) {
    logDebug("store: ", socket.peer(), " disconnected: ", error.message());
  } catch (const std::exception& error) {
    // E.g. bad_alloc for a large value: lose this connection, never the server.
    logWarn("store: dropping ", socket.peer(), ": ", error.what());
  }
  std::lock_guard<std::mutex> lock(connections_mutex_);
  if (connection.state == Connection::State::kHandshake) --pending_;
  if (connection.state == Connection::State::kServed) --served_;
  connection.state = Connection::State::kClosed;
  connection.finished = true;
}

void TcpStoreServer::serveRequests(wire::StoreChannel& channel) {
  while (!stopping_) {
    // An authenticated client may stay idle for the whole job (keepalive notices one that
    // vanished; stop() wakes us by shutdown), but a request, once begun, must arrive whole within
    // io_timeout, so a peer that stops mid-frame cannot hold its connection forever.
    channel.socket().awaitReadable(Deadline::never());
    Bytes request = channel.receive(deadlineFor(options_.io_timeout));
    channel.send(execute(request), deadlineFor(options_.io_timeout));
  }
}

std::unique_ptr<wire::StoreChannel> TcpStoreServer::authenticate(Connection& connection) {
  wire::Socket& socket = *connection.socket;
  Deadline deadline = deadlineFor(options_.handshake_timeout);
  Bytes nonce = randomBytes(wire::kNonceBytes);
  Bytes greeting(wire::kMagic, wire::kMagic + wire::kMagicBytes);
  greeting.insert(greeting.end(), nonce.begin(), nonce.end());
  socket.sendAll(greeting, deadline);

  // The magic alone first, so a peer speaking another protocol is dropped without waiting.
  Bytes magic = socket.recvBytes(wire::kMagicBytes, deadline);
  if (toString(magic) != wire::kMagic) {
    logDebug("store: dropping ", socket.peer(), ": it does not speak the chorus store protocol");
    return nullptr;
  }
  Bytes proof = socket.recvBytes(kDigestBytes, deadline);
  Bytes client_nonce = socket.recvBytes(wire::kNonceBytes, deadline);
  if (!constantTimeEqual(proof, options_.secret.sign(wire::kClientLabel, nonce))) {
    if (warningAllowed()) {
      logWarn("store: rejected ", socket.peer(), ": it does not know this job's secret");
    }
    Bytes refusal{static_cast<std::uint8_t>(Status::kAuthFailed)};  // raw: no frames before auth
    socket.sendAll(refusal, deadline);
    return nullptr;
  }
  int limit = 0;
  {
    std::lock_guard<std::mutex> lock(connections_mutex_);
    if (connection.state != Connection::State::kHandshake) return nullptr;  // evicted meanwhile
    limit = options_.max_connections;
    if (served_ < limit) {
      connection.state = Connection::State::kServed;
      --pending_;
      ++served_;
      limit = 0;
    }
  }
  if (limit > 0) {
    logWarn("store: refused ", socket.peer(), ": the job's ", limit,
            " connections are all in use (ranks, agents and a margin)");
    socket.sendAll(Bytes{static_cast<std::uint8_t>(Status::kTooManyConnections)}, deadline);
    return nullptr;
  }
  Bytes answer{static_cast<std::uint8_t>(Status::kOk)};
  Bytes server_proof = options_.secret.sign(wire::kServerLabel, client_nonce);
  answer.insert(answer.end(), server_proof.begin(), server_proof.end());
  socket.sendAll(answer, deadline);
  logDebug("store: authenticated ", socket.peer());
  return std::make_unique<wire::StoreChannel>(
      socket, wire::deriveSessionKeys(options_.secret, nonce, client_nonce), wire::Role::kServer);
}

bool TcpStoreServer::warningAllowed() {
  const std::int64_t now =
      std::chrono::duration_cast<Millis>(Clock::now().time_since_epoch()).count();
  std::int64_t next = next_warning_millis_.load();
  return now >= next &&
         next_warning_millis_.compare_exchange_strong(next, now + kWarningEveryMillis);
}

}  // namespace chorus::comm
