// Private to comm/store: the smallest HTTP/1.1 client that etcd's JSON gateway needs (EtcdStore).
//
// POST with a JSON body over one keep-alive connection; the reply's body is read by its
// Content-Length or its chunked encoding (Go's server chunks replies over a few kB, and a
// 64 MiB value is one). No TLS, no redirects, no proxies: the gateway is reached directly.
#pragma once

#include <memory>
#include <string>

#include "chorus/core/clock.h"

namespace chorus::comm::wire {
class Socket;
}  // namespace chorus::comm::wire

namespace chorus::comm {

// Value type.
struct HttpReply {
  int status = 0;
  std::string body;
};

// One connection to host:port, opened on the first request and again after a failure. Not
// thread-safe (EtcdStore serialises its requests); owns its socket.
class HttpConnection {
 public:
  HttpConnection(std::string host, int port);
  ~HttpConnection();
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  // Sends `body` to `path` and returns the reply, whatever its status. Throws CommError when the
  // connection cannot be made or is lost (the connection is then closed, and the next call opens
  // a new one), TimeoutError when `deadline` passes first, ProtocolError when the peer does not
  // answer in HTTP/1.1. `sent` is set once the request may have reached the server, so that a
  // caller retries only requests that are safe to repeat.
  HttpReply post(const std::string& path, const std::string& body, Deadline deadline, bool& sent);

  // "host:port".
  std::string endpoint() const;
  // Whether a connection is open now (a request on it may find it closed by the server).
  bool connected() const { return socket_ != nullptr; }
  void close();

 private:
  // Reads until `buffer_` holds `size` bytes past `offset`; CommError when the peer closes first.
  void fill(std::size_t size, Deadline deadline);
  // The next line (without CRLF) from the buffer, reading more as needed.
  std::string line(Deadline deadline);
  std::string readBody(bool chunked, long long length, Deadline deadline);

  std::string host_;
  int port_;
  std::unique_ptr<wire::Socket> socket_;
  std::string buffer_;  // received and not yet consumed
};

}  // namespace chorus::comm
