#include "store/http_client.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "chorus/core/error.h"
#include "store/store_protocol.h"

namespace chorus::comm {
namespace {

constexpr std::size_t kReadBytes = 64 * 1024;
// A status line or header longer than this is not etcd's gateway.
constexpr std::size_t kMaxLineBytes = 16 * 1024;
// Bodies are bounded as the store's frames are (two values and a key, base64 and JSON around).
constexpr long long kMaxBodyBytes = 4LL * wire::kMaxFrameBytes;

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

std::string trim(const std::string& text) {
  const std::size_t first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

}  // namespace

HttpConnection::HttpConnection(std::string host, int port) : host_(std::move(host)), port_(port) {}

HttpConnection::~HttpConnection() = default;

std::string HttpConnection::endpoint() const { return wire::formatEndpoint(host_, port_); }

void HttpConnection::close() {
  socket_.reset();
  buffer_.clear();
}

HttpReply HttpConnection::post(const std::string& path, const std::string& body, Deadline deadline,
                               bool& sent) {
  sent = false;
  if (!socket_)
    socket_ = std::make_unique<wire::Socket>(wire::Socket::connect(host_, port_, deadline));
  try {
    const std::string request =
        "POST " + path + " HTTP/1.1\r\nHost: " + endpoint() +
        "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
        "\r\n\r\n";
    sent = true;
    socket_->sendAll(request.data(), request.size(), deadline);
    socket_->sendAll(body.data(), body.size(), deadline);
    HttpReply reply;
    const std::string status = line(deadline);
    // "HTTP/1.1 200 OK"
    if (status.rfind("HTTP/1.", 0) != 0 || status.size() < 12)
      CHORUS_THROW(ProtocolError, endpoint(),
                   " does not answer in HTTP/1.1 (etcd's gateway does): '", status.substr(0, 64),
                   "'");
    reply.status = std::atoi(status.c_str() + 9);
    bool chunked = false, keep_alive = true;
    long long length = -1;
    for (std::string header = line(deadline); !header.empty(); header = line(deadline)) {
      const std::size_t colon = header.find(':');
      if (colon == std::string::npos) continue;
      const std::string name = lower(header.substr(0, colon));
      const std::string value = lower(trim(header.substr(colon + 1)));
      if (name == "content-length") length = std::atoll(value.c_str());
      if (name == "transfer-encoding") chunked = value.find("chunked") != std::string::npos;
      if (name == "connection") keep_alive = value != "close";
    }
    reply.body = readBody(chunked, length, deadline);
    if (!keep_alive) close();
    return reply;
  } catch (...) {
    // Whatever was half read belongs to no later request.
    close();
    throw;
  }
}

std::string HttpConnection::readBody(bool chunked, long long length, Deadline deadline) {
  std::string body;
  if (!chunked) {
    // Without a length (an HTTP/1.0-style reply) the body runs to the end of the connection;
    // etcd's gateway always sends one of the two.
    if (length < 0)
      CHORUS_THROW(ProtocolError, endpoint(), " sent a reply without Content-Length or chunks");
    if (length > kMaxBodyBytes)
      CHORUS_THROW(ProtocolError, endpoint(), " announced a reply of ", length, " bytes");
    fill(static_cast<std::size_t>(length), deadline);
    body = buffer_.substr(0, static_cast<std::size_t>(length));
    buffer_.erase(0, static_cast<std::size_t>(length));
    return body;
  }
  for (;;) {
    const long long size = std::strtoll(line(deadline).c_str(), nullptr, 16);
    if (size < 0 || static_cast<long long>(body.size()) + size > kMaxBodyBytes)
      CHORUS_THROW(ProtocolError, endpoint(), " sent a chunk of ", size, " bytes");
    if (size == 0) {
      // Trailers, up to the empty line.
      while (!line(deadline).empty()) {
      }
      return body;
    }
    fill(static_cast<std::size_t>(size) + 2, deadline);
    body.append(buffer_, 0, static_cast<std::size_t>(size));
    buffer_.erase(0, static_cast<std::size_t>(size) + 2);
  }
}

std::string HttpConnection::line(Deadline deadline) {
  for (std::size_t searched = 0;;) {
    const std::size_t end = buffer_.find("\r\n", searched > 0 ? searched - 1 : 0);
    if (end != std::string::npos) {
      std::string text = buffer_.substr(0, end);
      buffer_.erase(0, end + 2);
      return text;
    }
    if (buffer_.size() > kMaxLineBytes)
      CHORUS_THROW(ProtocolError, endpoint(), " sent a header line over ", kMaxLineBytes, " bytes");
    searched = buffer_.size();
    fill(buffer_.size() + 1, deadline);
  }
}

void HttpConnection::fill(std::size_t size, Deadline deadline) {
  char chunk[kReadBytes];
  while (buffer_.size() < size) {
    pollfd entry{socket_->fd(), POLLIN, 0};
    const Millis left = deadline.remaining();
    const int wait =
        left == Millis::max() ? 1000 : static_cast<int>(std::min<long long>(left.count(), 1000));
    const int ready = ::poll(&entry, 1, wait);
    if (ready < 0 && errno != EINTR)
      CHORUS_THROW(CommError, "poll on the connection to ", endpoint(),
                   " failed: ", std::strerror(errno));
    if (ready <= 0) {
      if (deadline.expired())
        CHORUS_THROW(TimeoutError, endpoint(), " did not answer before the deadline");
      continue;
    }
    const ssize_t n = ::recv(socket_->fd(), chunk, sizeof chunk, 0);
    if (n == 0) CHORUS_THROW(CommError, "lost the connection to ", endpoint(), ": it closed it");
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      CHORUS_THROW(CommError, "lost the connection to ", endpoint(), ": ", std::strerror(errno));
    }
    buffer_.append(chunk, static_cast<std::size_t>(n));
  }
}

}  // namespace chorus::comm
