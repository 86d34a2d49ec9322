#include "chorus/observe/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "chorus/core/error.h"

namespace chorus::observe {

struct MetricsServer::Context {
  MetricsServerOptions options;
  int listener = -1;
  std::atomic<bool> stopping{false};
  std::thread thread;
};

namespace {

constexpr const char* kPrometheusText = "text/plain; version=0.0.4; charset=utf-8";
// A client gets this long to send its request and take the answer; the server serves one client
// at a time (Prometheus and a page poll, a few requests a second at most).
constexpr int kClientTimeoutMs = 5000;
constexpr size_t kMaxRequest = 16 * 1024;

void sendAll(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    pollfd ready{fd, POLLOUT, 0};
    if (::poll(&ready, 1, kClientTimeoutMs) <= 0) return;
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

std::string response(int status, const char* reason, const char* type, const std::string& body) {
  return "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\nContent-Type: " + type +
         "\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n" + body;
}

// The request's path (without a query), or "" when no complete request line arrived in time.
std::string readPath(int fd) {
  std::string request;
  char buffer[2048];
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(kClientTimeoutMs);
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < kMaxRequest) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd ready{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&ready, 1, static_cast<int>(left.count())) <= 0) break;
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) break;
    request.append(buffer, static_cast<size_t>(n));
  }
  const size_t first = request.find(' ');
  const size_t second = first == std::string::npos ? first : request.find(' ', first + 1);
  if (second == std::string::npos) return "";
  std::string path = request.substr(first + 1, second - first - 1);
  return path.substr(0, path.find('?'));
}

void serveClient(int fd, const MetricsServerOptions& options) {
  const std::string path = readPath(fd);
  try {
    if (path == "/metrics")
      sendAll(fd, response(200, "OK", kPrometheusText, options.metrics()));
    else if (path == "/api/state")
      sendAll(fd, response(200, "OK", "application/json", options.state()));
    else if (path == "/" || path == "/index.html")
      sendAll(fd, response(200, "OK", "text/html; charset=utf-8", livePageHtml()));
    else if (!path.empty())
      sendAll(fd, response(404, "Not Found", "text/plain", "not found: " + path + "\n"));
  } catch (const std::exception& error) {
    sendAll(fd, response(500, "Internal Server Error", "text/plain", error.what()));
  }
}

void serve(MetricsServer::Context& context) {
  while (!context.stopping) {
    pollfd ready{context.listener, POLLIN, 0};
    if (::poll(&ready, 1, 100) <= 0) continue;
    const int client = ::accept4(context.listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    serveClient(client, context.options);
    ::shutdown(client, SHUT_WR);
    ::close(client);
  }
}

}  // namespace

void checkMetricsPort(int port, unsigned effective_uid) {
  CHORUS_CHECK_CONFIG(port >= 0 && port <= 65535, "--metrics-port ", port,
                      ": a TCP port is 0 (pick a free one) to 65535");
  CHORUS_CHECK_CONFIG(port == 0 || port >= 1024 || effective_uid == 0, "--metrics-port ", port,
                      ": ports below 1024 are privileged and this process is not root (uid ",
                      effective_uid, "); pick a port from 1024, or 0 for a free one");
}

MetricsServer::MetricsServer(MetricsServerOptions options) : context_(std::make_unique<Context>()) {
  CHORUS_CHECK_CONFIG(options.metrics && options.state,
                      "MetricsServer: the metrics and state callbacks are required");
  context_->options = std::move(options);
  const MetricsServerOptions& settings = context_->options;
  const std::string listening = settings.address + ":" + std::to_string(settings.port);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(settings.port));
  CHORUS_CHECK_CONFIG(::inet_pton(AF_INET, settings.address.c_str(), &address.sin_addr) == 1,
                      "--metrics-port: '", settings.address, "' is not an IPv4 address");
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int on = 1;
  if (fd >= 0) ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::listen(fd, 16) != 0) {
    const int error = errno;
    if (fd >= 0) ::close(fd);
    CHORUS_THROW(ConfigError, "--metrics-port ", settings.port, ": cannot listen on ", listening,
                 " (", std::strerror(error), ")", error == EADDRINUSE ? "; is the port busy?" : "");
  }
  socklen_t length = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  port_ = ntohs(address.sin_port);
  context_->listener = fd;
  context_->thread = std::thread([context = context_.get()] { serve(*context); });
}

MetricsServer::~MetricsServer() {
  context_->stopping = true;
  if (context_->thread.joinable()) context_->thread.join();
  if (context_->listener >= 0) ::close(context_->listener);
}

}  // namespace chorus::observe
