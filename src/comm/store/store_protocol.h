// The wire format of the TCP store, shared by TcpStoreServer and TcpStore (private to src/comm).
//
// Handshake (fixed sizes, before any frame, so nothing is allocated for an unauthenticated peer):
//   server → client   kMagic, server nonce (32 bytes)
//   client → server   kMagic, HMAC(secret, "client" || server nonce), client nonce (32 bytes)
//   server → client   kAuthFailed, then close                  (wrong secret)
//                  or kTooManyConnections, then close          (the job's connections are in use)
//                  or kOk, HMAC(secret, "server" || client nonce)
// Both ends then derive one key per direction (store_channel.h):
//   K(c→s) = HMAC(secret, "client->server" || server nonce || client nonce), K(s→c) likewise,
// and every later message is one authenticated frame (each direction numbered from 0):
//   header (12 bytes) = u64 sequence, u32 payload length          (big-endian)
//   frame = header, HMAC(K, 0x01 || header)[0..16), payload, HMAC(K, 0x02 || header || payload)
// The header has its own tag so that a modified length is caught before we wait for, or
// allocate, the payload it announces. A frame whose tag does not verify (modified, injected, or
// taken from another connection), or whose sequence number is not the next one (replayed,
// reordered, dropped), ends the connection with AuthError.
//   request payload = u8 Op, fields          reply payload = u8 Status, fields
// Fields: u8; i64 (big-endian); bytes and strings (u32 length, data); string lists (u32 count,
// strings). Keys are at most kMaxKeyBytes, values kMaxValueBytes, payloads kMaxFrameBytes: a
// client refuses larger ones before sending (ConfigError), a server refuses them from a peer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "chorus/comm/store/store.h"
#include "chorus/core/clock.h"

namespace chorus::comm::wire {

// v2: authenticated frames (v1 frames were a bare length and payload).
constexpr char kMagic[] = "CHORUSv2";
constexpr std::size_t kMagicBytes = sizeof(kMagic) - 1;
constexpr std::size_t kNonceBytes = 32;
constexpr char kClientLabel[] = "client";
constexpr char kServerLabel[] = "server";

// Limits of what the store holds and carries. Rendezvous data is small (addresses, counters,
// checkpoint manifests of a few kB), so these leave ample room and still bound what one request
// can make the server allocate.
constexpr std::size_t kMaxKeyBytes = 4096;
constexpr std::size_t kMaxValueBytes = std::size_t{64} << 20;
// compareSet carries a key and two values; the rest is field lengths and the op byte.
constexpr std::uint32_t kMaxFrameBytes = 2 * kMaxValueBytes + kMaxKeyBytes + 64;

enum class Op : std::uint8_t {
  kSet = 1,         // key, value                 → (nothing)
  kGet = 2,         // key, i64 timeout ms        → value
  kAdd = 3,         // key, i64 delta             → i64 new value
  kCompareSet = 4,  // key, expected, desired     → value
  kCheck = 5,       // keys                       → u8 all present
  kWait = 6,        // keys, i64 timeout ms       → (nothing)
  kDelete = 7,      // key                        → u8 existed
  kNumKeys = 8,     //                            → i64 count
};

enum class Status : std::uint8_t {
  kOk = 0,
  // Handshake: the client's proof is wrong. As a frame: a request failed authentication (followed
  // by a message). Either way the server closes the connection after it.
  kAuthFailed = 1,
  kTimeout = 2,     // get/wait: followed by the list of keys still missing
  kError = 3,       // the operation failed (e.g. add on a non-integer): followed by a message
  kBadRequest = 4,  // malformed request: followed by a message; the server closes the connection
  // Handshake only: the job's connection limit is reached; the server closes the connection.
  kTooManyConnections = 5,
};

// Why `key` or `value` cannot be stored (over kMaxKeyBytes / kMaxValueBytes); empty when it can.
std::string keyProblem(const std::string& key);
std::string valueProblem(const Bytes& value);

// Builds one frame's payload.
class Writer {
 public:
  Writer() = default;
  Writer& u8(std::uint8_t value);
  Writer& i64(std::int64_t value);
  Writer& bytes(const Bytes& value);
  Writer& str(const std::string& value);
  Writer& strings(const std::vector<std::string>& values);
  // The finished payload; leaves the writer empty. Throws ConfigError above kMaxFrameBytes.
  Bytes payload();

 private:
  void u32(std::uint32_t value);
  void raw(const void* data, std::size_t size);
  Bytes out_;
};

// Reads the fields of one frame's payload; throws ProtocolError when it runs short.
class Reader {
 public:
  explicit Reader(Bytes payload) : in_(std::move(payload)) {}
  std::uint8_t u8();
  std::int64_t i64();
  Bytes bytes();
  std::string str();
  std::vector<std::string> strings();
  // Throws ProtocolError unless every byte was consumed.
  void finish() const;

 private:
  std::uint32_t u32();
  const std::uint8_t* take(std::size_t size);
  Bytes in_;
  std::size_t pos_ = 0;
};

// A connected TCP socket whose every read and write is bounded by a deadline (poll), so a dead
// or silent peer never hangs us. Owns the file descriptor. Not thread-safe, except shutdown(),
// which any thread may call to wake one blocked in I/O. Errors name `peer` (e.g. "the store at
// host:7000"): CommError when the connection fails or closes, TimeoutError at the deadline.
class Socket {
 public:
  Socket(int fd, std::string peer);
  ~Socket();
  Socket(Socket&& other) noexcept
      : fd_(std::exchange(other.fd_, -1)), peer_(std::move(other.peer_)) {}
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  // Connects to host:port before `deadline` (one attempt per resolved address). Throws CommError.
  static Socket connect(const std::string& host, int port, Deadline deadline);

  void sendAll(const void* data, std::size_t size, Deadline deadline);
  void sendAll(const Bytes& data, Deadline deadline) {
    sendAll(data.data(), data.size(), deadline);
  }
  void recvAll(void* data, std::size_t size, Deadline deadline);
  Bytes recvBytes(std::size_t size, Deadline deadline);
  // Reads up to `size` bytes, fewer only if the peer closes first; returns how many arrived.
  std::size_t recvUpTo(void* data, std::size_t size, Deadline deadline);
  // Returns when data (or end of stream) can be read; TimeoutError at the deadline.
  void awaitReadable(Deadline deadline);
  // Wakes any thread blocked in I/O on this socket; later I/O fails.
  void shutdown();
  // Wakes a thread blocked reading (it reads end of stream) but lets writes go on, so that a
  // reply already on its way still reaches the peer.
  void shutdownRead();
  // Ends the connection after a last message: half-closes, then reads and discards what the
  // peer still sends, for at most `linger` and 64 KiB. Closing with unread input would reset the
  // connection, and the reset can destroy that last message before the peer reads it.
  void finish(Millis linger);

  int fd() const { return fd_; }
  const std::string& peer() const { return peer_; }

 private:
  // Waits for `events` before `deadline`; throws TimeoutError naming `what` when it passes.
  void waitFor(short events, Deadline deadline, const char* what);

  int fd_;
  std::string peer_;
};

// "host:port", with IPv6 hosts in brackets.
std::string formatEndpoint(const std::string& host, int port);
// Makes `fd` non-blocking with TCP_NODELAY (requests are small and latency-bound) and TCP
// keepalive (see kKeepalive* in the .cc): an idle connection whose peer vanished without closing
// it (power loss, a cut link) is reset within about two minutes instead of holding a connection
// slot, and a thread, for the rest of the job.
void configureSocket(int fd);

}  // namespace chorus::comm::wire
