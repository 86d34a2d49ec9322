#include <algorithm>
#include <thread>
#include <utility>

#include "chorus/comm/store/tcp_store.h"
#include "chorus/core/error.h"
#include "chorus/core/logging.h"
#include "store/store_channel.h"
#include "store/store_protocol.h"

namespace chorus::comm {
namespace {

using wire::Op;
using wire::Status;

constexpr Millis kFirstBackoff{10};
constexpr Millis kMaxBackoff{1000};
constexpr Millis kMaxReplyMargin = std::chrono::seconds(30);

Millis saturatingAdd(Millis a, Millis b) {
  if (a.count() > 0 && b.count() > Millis::max().count() - a.count()) return Millis::max();
  return a + b;
}

wire::Writer request(Op op) {
  wire::Writer out;
  out.u8(static_cast<std::uint8_t>(op));
  return out;
}

}  // namespace

TcpStore::TcpStore(TcpStoreOptions options) : options_(std::move(options)) {
  CHORUS_CHECK_CONFIG(!options_.secret.empty(), "the store client needs the job secret");
  CHORUS_CHECK_CONFIG(options_.port > 0 && options_.port <= 65535, "store port ", options_.port,
                      " is out of range");
  std::lock_guard<std::mutex> lock(mutex_);
  connectLocked();
}

TcpStore::~TcpStore() = default;

std::string TcpStore::endpoint() const {
  return wire::formatEndpoint(options_.host, options_.port);
}

void TcpStore::connectLocked() {
  Deadline deadline = deadlineFor(options_.connect_timeout);
  Millis backoff = kFirstBackoff;
  while (true) {
    try {
      socket_ = std::make_unique<wire::Socket>(
          wire::Socket::connect(options_.host, options_.port, deadline));
      if (handshake()) return;
      break;
    } catch (const AuthError&) {
      disconnectLocked();
      throw;
    } catch (const ProtocolError&) {
      disconnectLocked();
      throw;
    } catch (const CommError& error) {
      disconnectLocked();
      // Refused, reset or closed before greeting: the server may not be up yet, or busy with a
      // flood of handshakes. Retry until connect_timeout.
      if (deadline.expired()) {
        CHORUS_THROW(TimeoutError, "could not reach the store at ", endpoint(), " within ",
                     options_.connect_timeout.count(), " ms: ", error.message());
      }
      logDebug("store: ", endpoint(), " not reachable yet (", error.message(), "); retrying");
      std::this_thread::sleep_for(std::min(backoff, deadline.remaining()));
      backoff = std::min(backoff * 2, kMaxBackoff);
    }
  }
  disconnectLocked();
  CHORUS_THROW(CommError, "the store at ", endpoint(),
               " refused this connection: it already serves as many as the job may have (its "
               "ranks, its agents and a small margin); is some process of this job, or one that "
               "holds its secret, opening connections without closing them?");
}

void TcpStore::disconnectLocked() {
  channel_.reset();
  socket_.reset();
}

bool TcpStore::handshake() {
  wire::Socket& socket = *socket_;
  Deadline deadline = deadlineFor(std::min(options_.handshake_timeout, options_.io_timeout));
  char magic[wire::kMagicBytes];
  std::size_t got = 0;
  bool silent = false;
  try {
    got = socket.recvUpTo(magic, sizeof(magic), deadline);
  } catch (const TimeoutError&) {
    // c10d's TCPStore, for one, waits for its client to speak first.
    silent = true;
  }
  if (got == 0 && !silent) {
    // Closed at once: a chorus server that is stopping, or that dropped us to make room among
    // its pending handshakes; worth another try.
    CHORUS_THROW(CommError, "the store at ", endpoint(), " closed the connection before greeting");
  }
  if (got != wire::kMagicBytes || std::string(magic, got) != wire::kMagic) {
    CHORUS_THROW(ProtocolError, "the endpoint ", endpoint(),
                 " does not speak the chorus store protocol (",
                 got == 0 ? "it sent no greeting" : "wrong greeting",
                 "); is another service, e.g. a web server, a c10d TCPStore or a chorus of another "
                 "version, listening there?");
  }
  Bytes server_nonce = socket.recvBytes(wire::kNonceBytes, deadline);
  Bytes nonce = randomBytes(wire::kNonceBytes);
  Bytes hello(wire::kMagic, wire::kMagic + wire::kMagicBytes);
  Bytes proof = options_.secret.sign(wire::kClientLabel, server_nonce);
  hello.insert(hello.end(), proof.begin(), proof.end());
  hello.insert(hello.end(), nonce.begin(), nonce.end());
  socket.sendAll(hello, deadline);

  std::uint8_t status = 0;
  socket.recvAll(&status, 1, deadline);
  if (status == static_cast<std::uint8_t>(Status::kAuthFailed)) {
    CHORUS_THROW(AuthError, "the rendezvous at ", endpoint(),
                 " rejected this process's job secret (fingerprint ", options_.secret.fingerprint(),
                 "); pass the job's --secret-file");
  }
  if (status == static_cast<std::uint8_t>(Status::kTooManyConnections)) return false;
  if (status != static_cast<std::uint8_t>(Status::kOk)) {
    CHORUS_THROW(ProtocolError, "the store at ", endpoint(), " answered the handshake with status ",
                 static_cast<int>(status));
  }
  Bytes server_proof = socket.recvBytes(kDigestBytes, deadline);
  if (!constantTimeEqual(server_proof, options_.secret.sign(wire::kServerLabel, nonce))) {
    CHORUS_THROW(AuthError, "the store at ", endpoint(), " does not know this job's secret");
  }
  channel_ = std::make_unique<wire::StoreChannel>(
      socket, wire::deriveSessionKeys(options_.secret, server_nonce, nonce), wire::Role::kClient);
  return true;
}

wire::Reader TcpStore::roundTrip(Bytes request, Millis wait, const char* operation) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!channel_) connectLocked();
  try {
    return exchangeLocked(request, wait, operation);
  } catch (const ProtocolError& error) {
    disconnectLocked();
    CHORUS_THROW(ProtocolError, "the store at ", endpoint(), " sent a bad reply to ", operation,
                 ": ", error.message());
  } catch (const TimeoutError&) {
    throw;  // a TIMEOUT reply leaves the stream in sync; a local timeout has already reset it
  } catch (const CommError&) {
    // The stream may hold half a message now, or a frame failed authentication (AuthError):
    // only a fresh connection, with fresh keys, is safe.
    disconnectLocked();
    throw;
  }
}

wire::Reader TcpStore::exchangeLocked(const Bytes& request, Millis wait, const char* operation) {
  Millis patience =
      saturatingAdd(std::max(wait, Millis(0)), std::min(options_.io_timeout, kMaxReplyMargin));
  Bytes payload;
  try {
    channel_->send(request, deadlineFor(options_.io_timeout));
    payload = channel_->receive(deadlineFor(patience));
  } catch (const TimeoutError&) {
    disconnectLocked();  // a late reply would be taken for the next request's
    CHORUS_THROW(TimeoutError, "the store at ", endpoint(), " did not answer a ", operation,
                 " request within ", patience.count(), " ms; is the server alive?");
  } catch (const AuthError& error) {
    CHORUS_THROW(AuthError, "store ", operation, " at ", endpoint(), ": ", error.message(),
                 "; closed the connection");
  }
  wire::Reader in(std::move(payload));
  auto status = static_cast<Status>(in.u8());
  switch (status) {
    case Status::kOk:
      return in;
    case Status::kTimeout:
      CHORUS_THROW(TimeoutError, "store ", operation, " at ", endpoint(), " timed out after ",
                   wait.count(), " ms waiting for ", describeKeys(in.strings()));
    case Status::kError:
      CHORUS_THROW(CommError, "store ", operation, " at ", endpoint(), " failed: ", in.str());
    case Status::kAuthFailed:
      CHORUS_THROW(AuthError, "the store at ", endpoint(), " closed the connection because the ",
                   operation, " request failed authentication: ", in.str());
    case Status::kBadRequest:
      CHORUS_THROW(ProtocolError, "it refused the request: ", in.str());
    default:
      CHORUS_THROW(ProtocolError, "status ", static_cast<int>(status));
  }
}

void TcpStore::checkLimits(const char* operation, const std::string& key, const Bytes* value,
                           const Bytes* other) const {
  std::string problem = wire::keyProblem(key);
  if (problem.empty() && value) problem = wire::valueProblem(*value);
  if (problem.empty() && other) problem = wire::valueProblem(*other);
  if (!problem.empty())
    CHORUS_THROW(ConfigError, "store ", operation, " at ", endpoint(), ": ", problem);
}

void TcpStore::set(const std::string& key, const Bytes& value) {
  checkLimits("set", key, &value);
  roundTrip(request(Op::kSet).str(key).bytes(value).payload(), Millis(0), "set").finish();
}

Bytes TcpStore::get(const std::string& key, Millis timeout) {
  checkLimits("get", key);
  wire::Reader in =
      roundTrip(request(Op::kGet).str(key).i64(timeout.count()).payload(), timeout, "get");
  Bytes value = in.bytes();
  in.finish();
  return value;
}

std::int64_t TcpStore::add(const std::string& key, std::int64_t delta) {
  checkLimits("add", key);
  wire::Reader in = roundTrip(request(Op::kAdd).str(key).i64(delta).payload(), Millis(0), "add");
  std::int64_t value = in.i64();
  in.finish();
  return value;
}

Bytes TcpStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  checkLimits("compareSet", key, &expected, &desired);
  wire::Reader in =
      roundTrip(request(Op::kCompareSet).str(key).bytes(expected).bytes(desired).payload(),
                Millis(0), "compareSet");
  Bytes value = in.bytes();
  in.finish();
  return value;
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  for (const std::string& key : keys) checkLimits("check", key);
  wire::Reader in = roundTrip(request(Op::kCheck).strings(keys).payload(), Millis(0), "check");
  bool present = in.u8() != 0;
  in.finish();
  return present;
}

void TcpStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  for (const std::string& key : keys) checkLimits("wait", key);
  roundTrip(request(Op::kWait).strings(keys).i64(timeout.count()).payload(), timeout, "wait")
      .finish();
}

bool TcpStore::deleteKey(const std::string& key) {
  checkLimits("deleteKey", key);
  wire::Reader in = roundTrip(request(Op::kDelete).str(key).payload(), Millis(0), "deleteKey");
  bool existed = in.u8() != 0;
  in.finish();
  return existed;
}

std::int64_t TcpStore::numKeys() {
  wire::Reader in = roundTrip(request(Op::kNumKeys).payload(), Millis(0), "numKeys");
  std::int64_t count = in.i64();
  in.finish();
  return count;
}

}  // namespace chorus::comm
