#include "store/store_protocol.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>

#include "chorus/core/error.h"

namespace chorus::comm::wire {
namespace {

// An idle connection is probed after a minute and reset after six unanswered probes ten seconds
// apart: dead peers are found within two minutes, while the probes cost nothing measurable.
constexpr int kKeepaliveIdleSeconds = 60;
constexpr int kKeepaliveIntervalSeconds = 10;
constexpr int kKeepaliveProbes = 6;

int pollMillis(Deadline deadline) {
  Millis left = deadline.remaining();
  if (left == Millis::max()) return -1;
  return static_cast<int>(std::min<long long>(left.count(), INT_MAX));
}

// One non-blocking connect to `address`, finished before `deadline`; returns the fd or -1 with
// `error` set.
int connectAddress(const addrinfo& address, Deadline deadline, std::string& error) {
  int fd = ::socket(address.ai_family, address.ai_socktype | SOCK_CLOEXEC, address.ai_protocol);
  if (fd < 0) {
    error = std::strerror(errno);
    return -1;
  }
  configureSocket(fd);
  int rc = ::connect(fd, address.ai_addr, address.ai_addrlen);
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd entry{fd, POLLOUT, 0};
    do rc = ::poll(&entry, 1, pollMillis(deadline));
    while (rc < 0 && errno == EINTR);
    int so_error = ETIMEDOUT;
    socklen_t length = sizeof(so_error);
    if (rc > 0) ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &length);
    errno = so_error;
    rc = so_error == 0 ? 0 : -1;
  }
  if (rc != 0) {
    error = std::strerror(errno);
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

Writer& Writer::u8(std::uint8_t value) {
  out_.push_back(value);
  return *this;
}

Writer& Writer::i64(std::int64_t value) {
  auto bits = static_cast<std::uint64_t>(value);
  for (int shift = 56; shift >= 0; shift -= 8)
    out_.push_back(static_cast<std::uint8_t>(bits >> shift));
  return *this;
}

std::string keyProblem(const std::string& key) {
  if (key.size() <= kMaxKeyBytes) return "";
  return detail::concat("the key '", key.substr(0, 32), "...' is ", key.size(),
                        " bytes long; the store takes keys of at most ", kMaxKeyBytes, " bytes");
}

std::string valueProblem(const Bytes& value) {
  if (value.size() <= kMaxValueBytes) return "";
  return detail::concat("a value of ", value.size(), " bytes exceeds the store's limit of ",
                        kMaxValueBytes, " bytes per value");
}

Writer& Writer::bytes(const Bytes& value) {
  // Callers check valueProblem() first; this only keeps the u32 length from wrapping.
  CHORUS_CHECK_CONFIG(value.size() <= kMaxFrameBytes, valueProblem(value));
  u32(static_cast<std::uint32_t>(value.size()));
  raw(value.data(), value.size());
  return *this;
}

Writer& Writer::str(const std::string& value) {
  CHORUS_CHECK_CONFIG(value.size() <= kMaxFrameBytes, keyProblem(value));
  u32(static_cast<std::uint32_t>(value.size()));
  raw(value.data(), value.size());
  return *this;
}

Writer& Writer::strings(const std::vector<std::string>& values) {
  CHORUS_CHECK_CONFIG(values.size() <= kMaxFrameBytes, "too many keys (", values.size(), ")");
  u32(static_cast<std::uint32_t>(values.size()));
  for (const std::string& value : values) str(value);
  return *this;
}

Bytes Writer::payload() {
  CHORUS_CHECK_CONFIG(out_.size() <= kMaxFrameBytes, "a store request of ", out_.size(),
                      " bytes exceeds the limit of ", kMaxFrameBytes, " bytes");
  return std::move(out_);
}

void Writer::u32(std::uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8)
    out_.push_back(static_cast<std::uint8_t>(value >> shift));
}

void Writer::raw(const void* data, std::size_t size) {
  const auto* begin = static_cast<const std::uint8_t*>(data);
  out_.insert(out_.end(), begin, begin + size);
}

std::uint8_t Reader::u8() { return *take(1); }

std::int64_t Reader::i64() {
  const std::uint8_t* p = take(8);
  std::uint64_t bits = 0;
  for (int i = 0; i < 8; ++i) bits = (bits << 8) | p[i];
  return static_cast<std::int64_t>(bits);
}

Bytes Reader::bytes() {
  std::uint32_t size = u32();
  const std::uint8_t* p = take(size);
  return Bytes(p, p + size);
}

std::string Reader::str() {
  std::uint32_t size = u32();
  const std::uint8_t* p = take(size);
  return std::string(reinterpret_cast<const char*>(p), size);
}

std::vector<std::string> Reader::strings() {
  std::uint32_t count = u32();
  std::vector<std::string> values;
  // Each string needs at least its 4-byte length, which bounds `count` by the payload.
  values.reserve(std::min<std::size_t>(count, (in_.size() - pos_) / 4));
  for (std::uint32_t i = 0; i < count; ++i) values.push_back(str());
  return values;
}

void Reader::finish() const {
  if (pos_ != in_.size()) {
    CHORUS_THROW(ProtocolError, "a store message has ", in_.size() - pos_,
                 " unexpected trailing bytes");
  }
}

std::uint32_t Reader::u32() {
  const std::uint8_t* p = take(4);
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

const std::uint8_t* Reader::take(std::size_t size) {
  if (size > in_.size() - pos_) {
    CHORUS_THROW(ProtocolError, "a store message is truncated (", in_.size(), " bytes)");
  }
  const std::uint8_t* p = in_.data() + pos_;
  pos_ += size;
  return p;
}

Socket::Socket(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}

Socket::~Socket() {
  if (fd_ >= 0) ::close(fd_);
}

Socket Socket::connect(const std::string& host, int port, Deadline deadline) {
  std::string endpoint = formatEndpoint(host, port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) {
    CHORUS_THROW(CommError, "cannot resolve the store host ", endpoint, ": ", gai_strerror(rc));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> addresses(found, freeaddrinfo);
  std::string error = "no address";
  for (const addrinfo* address = found; address != nullptr; address = address->ai_next) {
    int fd = connectAddress(*address, deadline, error);
    if (fd >= 0) return Socket(fd, "the store at " + endpoint);
  }
  CHORUS_THROW(CommError, "cannot connect to the store at ", endpoint, ": ", error);
}

void Socket::sendAll(const void* data, std::size_t size, Deadline deadline) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  while (size > 0) {
    waitFor(POLLOUT, deadline, "accept data");
    // MSG_NOSIGNAL: a peer that vanished must be an error here, not a SIGPIPE for the process.
    ssize_t sent = ::send(fd_, p, size, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      CHORUS_THROW(CommError, "lost the connection to ", peer_, ": ", std::strerror(errno));
    }
    p += sent;
    size -= static_cast<std::size_t>(sent);
  }
}

void Socket::recvAll(void* data, std::size_t size, Deadline deadline) {
  std::size_t got = recvUpTo(data, size, deadline);
  if (got < size) {
    CHORUS_THROW(CommError, "lost the connection to ", peer_, ": it closed the connection");
  }
}

Bytes Socket::recvBytes(std::size_t size, Deadline deadline) {
  Bytes bytes(size);
  recvAll(bytes.data(), size, deadline);
  return bytes;
}

std::size_t Socket::recvUpTo(void* data, std::size_t size, Deadline deadline) {
  auto* p = static_cast<std::uint8_t*>(data);
  std::size_t got = 0;
  while (got < size) {
    waitFor(POLLIN, deadline, "answer");
    ssize_t n = ::recv(fd_, p + got, size - got, 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      CHORUS_THROW(CommError, "lost the connection to ", peer_, ": ", std::strerror(errno));
    }
    got += static_cast<std::size_t>(n);
  }
  return got;
}

void Socket::awaitReadable(Deadline deadline) { waitFor(POLLIN, deadline, "send anything"); }

void Socket::shutdown() { ::shutdown(fd_, SHUT_RDWR); }

void Socket::shutdownRead() { ::shutdown(fd_, SHUT_RD); }

void Socket::finish(Millis linger) {
  constexpr std::size_t kMaxDiscardedBytes = 64 * 1024;
  ::shutdown(fd_, SHUT_WR);
  Deadline deadline = deadlineFor(linger);
  char sink[4096];
  std::size_t discarded = 0;
  try {
    while (discarded < kMaxDiscardedBytes) {
      std::size_t got = recvUpTo(sink, sizeof(sink), deadline);
      discarded += got;
      if (got < sizeof(sink)) return;  // the peer closed too
    }
  } catch (const Error&) {
    // Past the linger, or the peer reset: nothing more to wait for.
  }
}

void Socket::waitFor(short events, Deadline deadline, const char* what) {
  pollfd entry{fd_, events, 0};
  while (true) {
    int rc = ::poll(&entry, 1, pollMillis(deadline));
    if (rc > 0) return;  // ready, or an error/hang-up that the next send/recv reports
    if (rc < 0 && errno != EINTR) {
      CHORUS_THROW(CommError, "poll on the connection to ", peer_,
                   " failed: ", std::strerror(errno));
    }
    if (rc == 0 && deadline.expired()) {
      CHORUS_THROW(TimeoutError, peer_, " did not ", what, " before the deadline");
    }
  }
}

std::string formatEndpoint(const std::string& host, int port) {
  bool ipv6 = host.find(':') != std::string::npos;
  return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

void configureSocket(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &kKeepaliveIdleSeconds, sizeof(int));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &kKeepaliveIntervalSeconds, sizeof(int));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &kKeepaliveProbes, sizeof(int));
}

}  // namespace chorus::comm::wire
