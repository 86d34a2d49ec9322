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
#include <thread>
#include <utility>

#include "chorus/comm/tcp_store.h"
#include "chorus/core/error.h"
#include "chorus/core/logging.h"
#include "store_protocol.h"

namespace chorus::comm {
namespace {

using wire::Op;
using wire::Status;

// How often the accept thread looks at the stop flag; bounds how long stop() takes.
constexpr int kAcceptPollMillis = 50;

std::string describePeer(const sockaddr_storage& address) {
  char host[NI_MAXHOST] = "?";
  char port[NI_MAXSERV] = "?";
  ::getnameinfo(reinterpret_cast<const sockaddr*>(&address), sizeof(address), host, sizeof(host),
                port, sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV);
  return std::string("client ") + host + ":" + port;
}

wire::Writer startReply(Status status) {
  wire::Writer out;
  out.u8(static_cast<std::uint8_t>(status));
  return out;
}

}  // namespace

// A client connection and the thread serving it. The socket is closed only after the thread is
// joined, so stop() can shut it down without racing a reused descriptor.
struct TcpStoreServer::Connection {
  std::unique_ptr<wire::Socket> socket;
  std::thread thread;
  std::atomic<bool> finished{false};
};

TcpStoreServer::TcpStoreServer(TcpStoreServerOptions options) : options_(std::move(options)) {
  CHORUS_CHECK_CONFIG(!options_.secret.empty(), "the store server needs the job secret");
  CHORUS_CHECK_CONFIG(options_.port >= 0 && options_.port <= 65535, "store port ", options_.port,
                      " is out of range");
  listen();
  accept_thread_ = std::thread([this] { acceptLoop(); });
  logInfo("store: listening on ", endpoint(), " (job secret ", options_.secret.fingerprint(), ")");
}

TcpStoreServer::~TcpStoreServer() { stop(); }

std::string TcpStoreServer::endpoint() const { return wire::formatEndpoint(options_.host, port_); }

void TcpStoreServer::stop() {
  std::lock_guard<std::mutex> stop_lock(stop_mutex_);
  stopping_ = true;
  if (accept_thread_.joinable()) accept_thread_.join();
  state_.close();  // wakes handlers blocked in get/wait
  std::list<std::unique_ptr<Connection>> connections;
  {
    std::lock_guard<std::mutex> lock(connections_mutex_);
    connections.swap(connections_);
  }
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
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
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
    if (rc > 0 && !stopping_) acceptOne();
    reapFinished();
  }
}

void TcpStoreServer::acceptOne() {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length, SOCK_CLOEXEC);
  if (fd < 0) {
    // Transient (the peer gave up, or we are out of descriptors for a moment): keep serving,
    // but pause so that a persistent error such as EMFILE does not spin this thread.
    if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
      logWarn("store: accept failed: ", std::strerror(errno));
      std::this_thread::sleep_for(Millis(kAcceptPollMillis));
    }
    return;
  }
  wire::configureSocket(fd);
  auto connection = std::make_unique<Connection>();
  connection->socket = std::make_unique<wire::Socket>(fd, describePeer(address));
  Connection& ref = *connection;
  std::lock_guard<std::mutex> lock(connections_mutex_);
  connections_.push_back(std::move(connection));
  ref.thread = std::thread([this, &ref] { serve(ref); });
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
  try {
    if (authenticate(socket)) {
      while (!stopping_) {
        // An authenticated client may stay idle for the whole job; stop() wakes us by shutdown.
        Bytes request = socket.recvFrame(Deadline::never());
        socket.sendAll(execute(request), deadlineFor(options_.io_timeout));
      }
    }
  } catch (const ProtocolError& error) {
    logWarn("store: dropping ", socket.peer(), ": ", error.message());
    try {
      socket.sendAll(startReply(Status::kBadRequest).str(error.message()).frame(),
                     deadlineFor(options_.io_timeout));
    } catch (const Error&) {
      // The peer is being dropped anyway.
    }
  } catch (const Error& error) {
    logDebug("store: ", socket.peer(), " disconnected: ", error.message());
  } catch (const std::exception& error) {
    // E.g. bad_alloc for a large value: lose this connection, never the server.
    logWarn("store: dropping ", socket.peer(), ": ", error.what());
  }
  connection.finished = true;
}

bool TcpStoreServer::authenticate(wire::Socket& socket) {
  Deadline deadline = deadlineFor(options_.handshake_timeout);
  Bytes nonce = randomBytes(wire::kNonceBytes);
  Bytes greeting(wire::kMagic, wire::kMagic + wire::kMagicBytes);
  greeting.insert(greeting.end(), nonce.begin(), nonce.end());
  socket.sendAll(greeting, deadline);

  // The magic alone first, so a peer speaking another protocol is dropped without waiting.
  Bytes magic = socket.recvBytes(wire::kMagicBytes, deadline);
  if (toString(magic) != wire::kMagic) {
    logDebug("store: dropping ", socket.peer(), ": it does not speak the chorus store protocol");
    return false;
  }
  Bytes proof = socket.recvBytes(kDigestBytes, deadline);
  Bytes client_nonce = socket.recvBytes(wire::kNonceBytes, deadline);
  if (!constantTimeEqual(proof, options_.secret.sign(wire::kClientLabel, nonce))) {
    logWarn("store: rejected ", socket.peer(), ": it does not know this job's secret");
    Bytes refusal{static_cast<std::uint8_t>(Status::kAuthFailed)};  // raw: no frames before auth
    socket.sendAll(refusal, deadline);
    return false;
  }
  Bytes answer{static_cast<std::uint8_t>(Status::kOk)};
  Bytes server_proof = options_.secret.sign(wire::kServerLabel, client_nonce);
  answer.insert(answer.end(), server_proof.begin(), server_proof.end());
  socket.sendAll(answer, deadline);
  logDebug("store: authenticated ", socket.peer());
  return true;
}

Bytes TcpStoreServer::execute(const Bytes& request) {
  wire::Reader in(request);
  auto op = static_cast<Op>(in.u8());
  try {
    switch (op) {
      case Op::kGet:
        return executeGet(in);
      case Op::kWait:
        return executeWait(in);
      default:
        return executeImmediate(op, in);
    }
  } catch (const ProtocolError&) {
    throw;  // the connection is dropped: its stream can no longer be trusted
  } catch (const CommError& error) {
    return startReply(Status::kError).str(error.message()).frame();
  }
}

Bytes TcpStoreServer::executeGet(wire::Reader& in) {
  std::string key = in.str();
  Millis timeout(in.i64());
  in.finish();
  std::optional<Bytes> value = state_.getFor(key, timeout);
  if (!value) return startReply(Status::kTimeout).strings({key}).frame();
  return startReply(Status::kOk).bytes(*value).frame();
}

Bytes TcpStoreServer::executeWait(wire::Reader& in) {
  std::vector<std::string> keys = in.strings();
  Millis timeout(in.i64());
  in.finish();
  std::vector<std::string> missing = state_.waitFor(keys, timeout);
  if (!missing.empty()) return startReply(Status::kTimeout).strings(missing).frame();
  return startReply(Status::kOk).frame();
}

Bytes TcpStoreServer::executeImmediate(wire::Op op, wire::Reader& in) {
  wire::Writer ok = startReply(Status::kOk);
  std::string key = op == Op::kCheck || op == Op::kNumKeys ? std::string() : in.str();
  switch (op) {
    case Op::kSet: {
      Bytes value = in.bytes();
      in.finish();
      state_.set(key, value);
      return ok.frame();
    }
    case Op::kAdd: {
      std::int64_t delta = in.i64();
      in.finish();
      return ok.i64(state_.add(key, delta)).frame();
    }
    case Op::kCompareSet: {
      Bytes expected = in.bytes();
      Bytes desired = in.bytes();
      in.finish();
      return ok.bytes(state_.compareSet(key, expected, desired)).frame();
    }
    case Op::kCheck: {
      std::vector<std::string> keys = in.strings();
      in.finish();
      return ok.u8(state_.check(keys) ? 1 : 0).frame();
    }
    case Op::kDelete:
      in.finish();
      return ok.u8(state_.deleteKey(key) ? 1 : 0).frame();
    case Op::kNumKeys:
      in.finish();
      return ok.i64(state_.numKeys()).frame();
    default:
      CHORUS_THROW(ProtocolError, "unknown store request type ", static_cast<int>(op));
  }
}

}  // namespace chorus::comm
