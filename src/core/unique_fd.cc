#include "chorus/core/unique_fd.h"

#include <unistd.h>

#include <utility>

namespace chorus {

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

int UniqueFd::release() { return std::exchange(fd_, -1); }

void UniqueFd::reset(int fd) {
  // close() is not retried on EINTR: on Linux the descriptor is gone either way.
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

int UniqueFd::close() { return ::close(release()); }

}  // namespace chorus
