// A client of the store's wire protocol written from its description (src/comm/store_protocol.h)
// rather than from the implementation, for tests: it pins the format byte for byte, and it sends
// what TcpStore never would — pipelined, oversized, truncated or out-of-order frames. Blocking
// sockets with a 5 s receive timeout, so no test can hang on it. Test code: failures are
// reported with gtest assertions.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <optional>
#include <string>

#include "chorus/comm/store/job_secret.h"
#include "chorus/comm/store/store.h"

namespace chorus::comm::testing {

constexpr std::size_t kGreetingBytes = 8 + 32;    // magic, server nonce
constexpr std::size_t kHelloBytes = 8 + 32 + 32;  // magic, proof, client nonce
constexpr std::size_t kFrameHeadBytes = 12 + 16;  // sequence, length, header tag
constexpr std::size_t kFrameTagBytes = 32;

// A blocking loopback socket connected to `port`, with a 5 s receive timeout.
inline int rawConnect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  timeval timeout{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  return fd;
}

// Reads until EOF, error or `size` bytes; returns what arrived.
inline Bytes rawRead(int fd, std::size_t size) {
  Bytes data(size);
  std::size_t got = 0;
  while (got < size) {
    ssize_t n = ::recv(fd, data.data() + got, size - got, 0);
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  data.resize(got);
  return data;
}

inline void rawWrite(int fd, const Bytes& data) {
  ASSERT_EQ(::send(fd, data.data(), data.size(), MSG_NOSIGNAL), static_cast<ssize_t>(data.size()));
}

inline Bytes joined(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

inline void putBigEndian(Bytes& out, std::uint64_t value, int bytes) {
  const std::size_t at = out.size();
  out.resize(at + bytes);
  for (int i = 0; i < bytes; ++i)
    out[at + i] = static_cast<std::uint8_t>(value >> (8 * (bytes - 1 - i)));
}

inline std::uint64_t getBigEndian(const std::uint8_t* in, int bytes) {
  std::uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value = (value << 8) | in[i];
  return value;
}

// Request payloads: u8 op, then fields.
inline Bytes stringField(const std::string& text) {
  Bytes out;
  putBigEndian(out, text.size(), 4);
  out.resize(4 + text.size());
  std::copy(text.begin(), text.end(), out.begin() + 4);
  return out;
}
inline Bytes setRequest(const std::string& key, const std::string& value) {
  return joined(joined(Bytes{1}, stringField(key)), stringField(value));
}
inline Bytes addRequest(const std::string& key, std::int64_t delta) {
  Bytes out = joined(Bytes{3}, stringField(key));
  putBigEndian(out, static_cast<std::uint64_t>(delta), 8);
  return out;
}

// The frame's total size from its first kFrameHeadBytes.
inline std::size_t frameSize(const std::uint8_t* head) {
  return kFrameHeadBytes + getBigEndian(head + 8, 4) + kFrameTagBytes;
}

class WireClient {
 public:
  // Connects to `port` and runs the handshake with `secret`; check authenticated().
  WireClient(int port, const JobSecret& secret) : fd_(rawConnect(port)) {
    Bytes greeting = rawRead(fd_, kGreetingBytes);
    if (greeting.size() != kGreetingBytes) return;
    Bytes server_nonce(greeting.begin() + 8, greeting.end());
    Bytes nonce(32);
    for (std::size_t i = 0; i < nonce.size(); ++i) nonce[i] = static_cast<std::uint8_t>(i * 7 + 1);
    Bytes hello = joined(toBytes("CHORUSv2"), secret.sign("client", server_nonce));
    rawWrite(fd_, joined(hello, nonce));
    Bytes answer = rawRead(fd_, 1 + 32);
    if (answer.size() != 33 || answer[0] != 0) return;
    if (Bytes(answer.begin() + 1, answer.end()) != secret.sign("server", nonce)) return;
    Bytes nonces = joined(server_nonce, nonce);
    send_key_ = toString(secret.sign("client->server", nonces));
    receive_key_ = toString(secret.sign("server->client", nonces));
    authenticated_ = true;
  }
  ~WireClient() { ::close(fd_); }
  WireClient(const WireClient&) = delete;
  WireClient& operator=(const WireClient&) = delete;

  bool authenticated() const { return authenticated_; }
  int fd() const { return fd_; }

  // The next client→server frame for `payload`; `length` overrides the announced length.
  Bytes seal(const Bytes& payload, std::optional<std::uint32_t> length = std::nullopt) {
    Bytes header;
    putBigEndian(header, send_sequence_++, 8);
    putBigEndian(header, length.value_or(static_cast<std::uint32_t>(payload.size())), 4);
    Bytes header_tag = hmacSha256(send_key_, joined(Bytes{1}, header));
    header_tag.resize(16);
    Bytes frame_tag = hmacSha256(send_key_, joined(joined(Bytes{2}, header), payload));
    return joined(joined(joined(header, header_tag), payload), frame_tag);
  }
  void send(const Bytes& payload) { rawWrite(fd_, seal(payload)); }

  // The payload of the next server→client frame; nullopt when the connection ended first or the
  // frame does not verify (wrong tag or sequence number).
  std::optional<Bytes> receive() {
    Bytes head = rawRead(fd_, kFrameHeadBytes);
    if (head.size() != kFrameHeadBytes) return std::nullopt;
    Bytes rest = rawRead(fd_, frameSize(head.data()) - kFrameHeadBytes);
    if (rest.size() != frameSize(head.data()) - kFrameHeadBytes) return std::nullopt;
    Bytes header(head.begin(), head.begin() + 12);
    Bytes header_tag = hmacSha256(receive_key_, joined(Bytes{1}, header));
    Bytes payload(rest.begin(), rest.end() - kFrameTagBytes);
    Bytes tag(rest.end() - kFrameTagBytes, rest.end());
    if (!std::equal(head.begin() + 12, head.end(), header_tag.begin())) return std::nullopt;
    if (tag != hmacSha256(receive_key_, joined(joined(Bytes{2}, header), payload)))
      return std::nullopt;
    if (getBigEndian(head.data(), 8) != receive_sequence_++) return std::nullopt;
    return payload;
  }

  // True when the server closed the connection (end of stream within 5 s, nothing more to read).
  bool closedByServer() {
    std::uint8_t byte = 0;
    ssize_t n = ::recv(fd_, &byte, 1, 0);
    if (n < 0 && errno == ECONNRESET) return true;
    return n == 0;
  }

 private:
  int fd_;
  bool authenticated_ = false;
  std::string send_key_;
  std::string receive_key_;
  std::uint64_t send_sequence_ = 0;
  std::uint64_t receive_sequence_ = 0;
};

// The text after the status byte of a reply (status, u32 length, text), or "" if there is none.
inline std::string replyMessage(const Bytes& reply) {
  if (reply.size() < 5) return "";
  return std::string(reply.begin() + 5, reply.end());
}

}  // namespace chorus::comm::testing
