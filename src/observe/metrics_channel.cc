#include "chorus/observe/metrics_channel.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "chorus/core/error.h"

namespace chorus::observe {
namespace {

// Large enough for a report of any rank (a few hundred bytes per collective op kind).
constexpr size_t kMaxDatagram = 64 * 1024;

sockaddr_un socketAddress(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  CHORUS_CHECK_CONFIG(!path.empty() && path.size() < sizeof address.sun_path,
                      "metrics channel: socket path '", path, "' is empty or longer than ",
                      sizeof address.sun_path - 1, " bytes");
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  return address;
}

}  // namespace

MetricsReceiver::MetricsReceiver(const std::string& parent) {
  std::string base = parent.empty() ? std::filesystem::temp_directory_path().string() : parent;
  std::vector<char> pattern(base.begin(), base.end());
  const std::string suffix = "/chorus-metrics-XXXXXX";
  pattern.insert(pattern.end(), suffix.begin(), suffix.end());
  pattern.push_back('\0');
  if (!::mkdtemp(pattern.data()))
    CHORUS_THROW(ConfigError, "metrics channel: cannot create a directory in ", base, ": ",
                 std::strerror(errno));
  dir_ = pattern.data();
  path_ = dir_ + "/workers.sock";
  const sockaddr_un address = socketAddress(path_);
  fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0 || ::bind(fd_, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
    const std::string reason = std::strerror(errno);
    if (fd_ >= 0) ::close(fd_);
    std::filesystem::remove_all(dir_);
    CHORUS_THROW(ConfigError, "metrics channel: cannot bind ", path_, ": ", reason);
  }
  // Room for many reports while the agent serves a scrape.
  const int buffer = 4 << 20;
  ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
}

MetricsReceiver::~MetricsReceiver() {
  if (fd_ >= 0) ::close(fd_);
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::optional<std::string> MetricsReceiver::receive(std::chrono::milliseconds timeout) {
  pollfd ready{fd_, POLLIN, 0};
  const int polled = ::poll(&ready, 1, static_cast<int>(timeout.count()));
  if (polled <= 0 || !(ready.revents & POLLIN)) return std::nullopt;
  std::string message(kMaxDatagram, '\0');
  const ssize_t got = ::recv(fd_, message.data(), message.size(), MSG_DONTWAIT);
  if (got < 0) return std::nullopt;
  message.resize(static_cast<size_t>(got));
  return message;
}

MetricsSender::MetricsSender(const std::string& path) : path_(path) {
  socketAddress(path_);  // validates
  fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0)
    CHORUS_THROW(ConfigError, "metrics channel: cannot create a socket: ", std::strerror(errno));
}

MetricsSender::~MetricsSender() {
  if (fd_ >= 0) ::close(fd_);
}

bool MetricsSender::send(const std::string& message) {
  const sockaddr_un address = socketAddress(path_);
  const ssize_t sent = ::sendto(fd_, message.data(), message.size(), MSG_DONTWAIT | MSG_NOSIGNAL,
                                reinterpret_cast<const sockaddr*>(&address), sizeof address);
  if (sent == static_cast<ssize_t>(message.size())) return true;
  ++dropped_;
  return false;
}

}  // namespace chorus::observe
