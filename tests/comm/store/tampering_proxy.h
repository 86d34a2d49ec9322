// A TCP proxy between store clients and a TcpStoreServer that plays the attacker on the path: it
// relays each handshake untouched, then cuts both streams into frames (by the length in each
// header, store_protocol.h) and lets a rule decide what to forward in place of each frame —
// the frame, a modified copy, nothing (held back), an earlier frame (replayed), several frames
// (reordered), garbage, or a part of it (a peer that stops mid-frame). Fault injection from
// outside, as the issue asks: no code path of the store knows it is being tested.
//
// Owns its listening socket, its connections and one thread per direction of each; the
// destructor closes them all and joins. Rules are called one at a time (under one mutex).
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/store/store_wire.h"

namespace chorus::comm::testing {

enum class Direction { kToServer, kToClient };

// What to send in place of frame `index` (0-based, per connection and direction; the handshake
// is not counted) of connection `connection` (0-based, in order of arrival).
using FrameRule = std::function<std::vector<Bytes>(Direction direction, int connection, int index,
                                                   const Bytes& frame)>;

// Forwards every frame as it is.
inline std::vector<Bytes> passThrough(Direction, int, int, const Bytes& frame) { return {frame}; }

class TamperingProxy {
 public:
  TamperingProxy(int server_port, FrameRule rule)
      : server_port_(server_port), rule_(std::move(rule)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    EXPECT_EQ(::listen(listener_, 16), 0);
    socklen_t length = sizeof(address);
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    accept_thread_ = std::thread([this] { acceptLoop(); });
  }

  ~TamperingProxy() {
    stopping_ = true;
    accept_thread_.join();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (int fd : sockets_) ::shutdown(fd, SHUT_RDWR);
    }
    for (std::thread& thread : relays_) thread.join();
    for (int fd : sockets_) ::close(fd);
    ::close(listener_);
  }

  int port() const { return port_; }
  // How many frames the rule has seen so far (both directions, all connections).
  int framesSeen() const { return frames_seen_; }

 private:
  void acceptLoop() {
    int connection = 0;
    while (!stopping_) {
      pollfd entry{listener_, POLLIN, 0};
      if (::poll(&entry, 1, 20) <= 0) continue;
      int client = ::accept(listener_, nullptr, nullptr);
      if (client < 0) continue;
      int server = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in address{};
      address.sin_family = AF_INET;
      address.sin_port = htons(static_cast<uint16_t>(server_port_));
      address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      EXPECT_EQ(::connect(server, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
      std::lock_guard<std::mutex> lock(mutex_);
      sockets_.push_back(client);
      sockets_.push_back(server);
      relays_.emplace_back([this, client, server, connection] {
        relay(client, server, Direction::kToServer, connection);
      });
      relays_.emplace_back([this, client, server, connection] {
        relay(server, client, Direction::kToClient, connection);
      });
      ++connection;
    }
  }

  // Copies the handshake bytes of this direction, then frame by frame through the rule. Ends,
  // shutting both sockets down, when either side closes. A rule that forwards half a frame
  // leaves the receiver waiting for the rest: a peer that stopped mid-frame.
  void relay(int from, int to, Direction direction, int connection) {
    bool ok = true;
    if (direction == Direction::kToServer) {
      ok = copy(from, to, kHelloBytes);
    } else {
      ok = copy(from, to, kGreetingBytes);
      Bytes status = rawRead(from, 1);
      ok = ok && status.size() == 1 && send(to, status);
      // Only an accepted handshake is followed by the server's proof and by frames.
      ok = ok && status[0] == 0 && copy(from, to, 32);
    }
    for (int index = 0; ok && !stopping_; ++index) {
      Bytes frame = rawRead(from, kFrameHeadBytes);
      if (frame.size() != kFrameHeadBytes) break;
      Bytes rest = rawRead(from, frameSize(frame.data()) - kFrameHeadBytes);
      if (rest.size() != frameSize(frame.data()) - kFrameHeadBytes) break;
      frame = joined(frame, rest);
      std::vector<Bytes> out;
      {
        std::lock_guard<std::mutex> lock(rule_mutex_);
        ++frames_seen_;
        out = rule_(direction, connection, index, frame);
      }
      for (const Bytes& piece : out) ok = ok && send(to, piece);
    }
    ::shutdown(from, SHUT_RDWR);
    ::shutdown(to, SHUT_RDWR);
  }

  bool copy(int from, int to, std::size_t size) {
    Bytes bytes = rawRead(from, size);
    return bytes.size() == size && send(to, bytes);
  }

  static bool send(int fd, const Bytes& bytes) {
    return bytes.empty() || ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
                                static_cast<ssize_t>(bytes.size());
  }

  int server_port_;
  FrameRule rule_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  std::mutex mutex_;  // guards sockets_ and relays_
  std::vector<int> sockets_;
  std::list<std::thread> relays_;
  std::mutex rule_mutex_;
  std::atomic<int> frames_seen_{0};
};

}  // namespace chorus::comm::testing
