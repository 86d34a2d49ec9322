// The authenticated frame stream of one store connection (private to src/comm).
//
// After the handshake (store_protocol.h) both ends hold two fresh nonces and the job secret. From
// them each derives one key per direction, so no frame of this connection is valid on another
// (the nonces differ) or in the other direction (the keys differ). Every frame then carries its
// sequence number and HMAC-SHA256 tags under that key: a modified, injected, replayed, reordered
// or dropped frame is an AuthError at the receiver, and the connection ends. The store's frames
// are not encrypted: the secret protects who may read and change the job's state, and that the
// state is not changed in transit; docs/security.md says what it does not protect.
#pragma once

#include <openssl/types.h>

#include <array>
#include <cstddef>
#include <cstdint>

#include "chorus/comm/store/job_secret.h"
#include "chorus/comm/store/store.h"
#include "chorus/core/clock.h"
#include "store/store_protocol.h"

namespace chorus::comm::wire {

constexpr std::size_t kHeaderBytes = 12;     // u64 sequence, u32 payload length
constexpr std::size_t kHeaderTagBytes = 16;  // truncated HMAC: a forgery still needs 2^128 tries
constexpr std::size_t kFrameTagBytes = kDigestBytes;
constexpr char kClientToServerLabel[] = "client->server";
constexpr char kServerToClientLabel[] = "server->client";

// The two keys of one connection: HMAC(secret, label || server nonce || client nonce).
struct SessionKeys {
  Bytes client_to_server;
  Bytes server_to_client;
};
SessionKeys deriveSessionKeys(const JobSecret& secret, const Bytes& server_nonce,
                              const Bytes& client_nonce);

// HMAC-SHA256 under one key, whose key schedule is computed once (OpenSSL's EVP_MAC, re-initialised
// per message), so a frame costs two short hashes rather than two key setups. Owns its OpenSSL
// context; not thread-safe; movable only by pointer.
class FrameMac {
 public:
  explicit FrameMac(const Bytes& key);
  ~FrameMac();
  FrameMac(const FrameMac&) = delete;
  FrameMac& operator=(const FrameMac&) = delete;

  // HMAC(key, domain || first || second). Throws CommError if OpenSSL fails.
  std::array<std::uint8_t, kDigestBytes> tag(std::uint8_t domain, const std::uint8_t* first,
                                             std::size_t first_size,
                                             const std::uint8_t* second = nullptr,
                                             std::size_t second_size = 0);

 private:
  EVP_MAC* mac_ = nullptr;
  EVP_MAC_CTX* context_ = nullptr;
};

enum class Role { kClient, kServer };

// One authenticated connection: the keys and the two sequence counters over a socket that the
// caller owns and keeps alive (the server shuts sockets down from other threads, so it keeps them
// itself). Not thread-safe: the client uses it under its mutex, the server from the connection's
// own thread.
class StoreChannel {
 public:
  StoreChannel(Socket& socket, const SessionKeys& keys, Role role);

  // Seals `payload` (REQUIRES: at most kMaxFrameBytes) as the next frame and sends it.
  void send(const Bytes& payload, Deadline deadline);
  // Receives the next frame, whole, before `deadline`, and returns its payload. Throws AuthError
  // when it fails authentication or is out of sequence, ProtocolError when an authenticated peer
  // announces more than kMaxFrameBytes (nothing is allocated for it), CommError / TimeoutError
  // when the connection fails or the deadline passes.
  Bytes receive(Deadline deadline);

  Socket& socket() { return socket_; }
  // How many frames were received and verified so far (the sequence number due next).
  std::uint64_t received() const { return receive_sequence_; }

 private:
  Socket& socket_;
  FrameMac send_mac_;
  FrameMac receive_mac_;
  std::uint64_t send_sequence_ = 0;
  std::uint64_t receive_sequence_ = 0;
};

}  // namespace chorus::comm::wire
