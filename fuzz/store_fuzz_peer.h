// The other end of a store connection for the store fuzz targets: the handshake of
// src/comm/store_protocol.h done right (so the fuzzer reaches the frames behind it), and the
// input format both targets share. Uses the private wire classes of src/comm, as the fuzz build
// compiles against them.
//
// Input format: one mode byte, then records, each a u16 length (big-endian) and that many bytes.
// Records are sealed as authenticated frames (or, for raw modes, sent as they are).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "chorus/comm/store/job_secret.h"
#include "chorus/comm/store/store.h"
#include "store/store_channel.h"
#include "store/store_protocol.h"

namespace chorus::fuzz {

// The secret both ends of a fuzzed connection hold.
inline const comm::JobSecret& fuzzSecret() {
  static const comm::JobSecret secret = comm::JobSecret::fromText("fuzz-secret-0123456789abcdef");
  return secret;
}

// How the records of an input reach the peer under test.
enum class Mode : std::uint8_t {
  kRawHandshake = 0,  // no handshake of ours: the records' bytes are the handshake
  kFrames = 1,        // a good handshake, then every record as one authenticated frame
  kRawAfterAuth = 2,  // a good handshake, then the records' bytes as they are (bad framing)
};

struct FuzzInput {
  Mode mode = Mode::kFrames;
  std::vector<comm::Bytes> records;
};

inline FuzzInput splitInput(const std::uint8_t* data, std::size_t size) {
  FuzzInput input;
  if (size == 0) return input;
  input.mode = static_cast<Mode>(data[0] % 3);
  std::size_t pos = 1;
  while (pos + 2 <= size) {
    std::size_t length = (std::size_t{data[pos]} << 8) | data[pos + 1];
    pos += 2;
    length = std::min(length, size - pos);
    input.records.emplace_back(data + pos, data + pos + length);
    pos += length;
  }
  return input;
}

// All records joined, for the raw modes.
inline comm::Bytes joinedRecords(const FuzzInput& input) {
  comm::Bytes all;
  for (const comm::Bytes& record : input.records)
    all.insert(all.end(), record.begin(), record.end());
  return all;
}

// A listening loopback socket on an ephemeral port. Owns the descriptor.
class Listener {
 public:
  Listener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
        ::listen(fd_, 16) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      std::perror("fuzz listener");
      std::abort();
    }
    port_ = ntohs(address.sin_port);
  }
  ~Listener() { ::close(fd_); }
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  int port() const { return port_; }
  // The next connection within `millis`, or null.
  std::unique_ptr<comm::wire::Socket> accept(int millis) {
    pollfd entry{fd_, POLLIN, 0};
    if (::poll(&entry, 1, millis) <= 0) return nullptr;
    int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return nullptr;
    comm::wire::configureSocket(fd);
    return std::make_unique<comm::wire::Socket>(fd, "the fuzzed peer");
  }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// The client's half of the handshake over `socket`; the channel on success. Throws chorus errors.
inline std::unique_ptr<comm::wire::StoreChannel> clientHandshake(comm::wire::Socket& socket,
                                                                 Deadline deadline) {
  namespace wire = comm::wire;
  comm::Bytes greeting = socket.recvBytes(wire::kMagicBytes + wire::kNonceBytes, deadline);
  comm::Bytes server_nonce(greeting.begin() + wire::kMagicBytes, greeting.end());
  comm::Bytes nonce = comm::randomBytes(wire::kNonceBytes);
  comm::Bytes hello(wire::kMagic, wire::kMagic + wire::kMagicBytes);
  comm::Bytes proof = fuzzSecret().sign(wire::kClientLabel, server_nonce);
  hello.insert(hello.end(), proof.begin(), proof.end());
  hello.insert(hello.end(), nonce.begin(), nonce.end());
  socket.sendAll(hello, deadline);
  comm::Bytes answer = socket.recvBytes(1 + comm::kDigestBytes, deadline);
  if (answer[0] != static_cast<std::uint8_t>(wire::Status::kOk)) return nullptr;
  return std::make_unique<wire::StoreChannel>(
      socket, wire::deriveSessionKeys(fuzzSecret(), server_nonce, nonce), wire::Role::kClient);
}

// The server's half of the handshake over `socket`; the channel on success. Throws chorus errors.
inline std::unique_ptr<comm::wire::StoreChannel> serverHandshake(comm::wire::Socket& socket,
                                                                 Deadline deadline) {
  namespace wire = comm::wire;
  comm::Bytes nonce = comm::randomBytes(wire::kNonceBytes);
  comm::Bytes greeting(wire::kMagic, wire::kMagic + wire::kMagicBytes);
  greeting.insert(greeting.end(), nonce.begin(), nonce.end());
  socket.sendAll(greeting, deadline);
  comm::Bytes hello =
      socket.recvBytes(wire::kMagicBytes + comm::kDigestBytes + wire::kNonceBytes, deadline);
  comm::Bytes client_nonce(hello.end() - wire::kNonceBytes, hello.end());
  comm::Bytes answer{static_cast<std::uint8_t>(wire::Status::kOk)};
  comm::Bytes proof = fuzzSecret().sign(wire::kServerLabel, client_nonce);
  answer.insert(answer.end(), proof.begin(), proof.end());
  socket.sendAll(answer, deadline);
  return std::make_unique<wire::StoreChannel>(
      socket, wire::deriveSessionKeys(fuzzSecret(), nonce, client_nonce), wire::Role::kServer);
}

}  // namespace chorus::fuzz
