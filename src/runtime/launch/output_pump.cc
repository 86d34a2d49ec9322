#include "launch/output_pump.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include <utility>

#include "chorus/core/logging.h"

namespace chorus::runtime {

bool writeAll(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n > 0) {
      data += n;
      size -= static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // The agent's stdout may be a non-blocking descriptor it inherited; wait like a blocking
      // write would rather than drop the output.
      pollfd wait{fd, POLLOUT, 0};
      if (::poll(&wait, 1, -1) < 0 && errno != EINTR) return false;
      continue;
    }
    if (n == 0) errno = EIO;
    return false;
  }
  return true;
}

OutputPump::OutputPump(std::string prefix, int sink_fd, int log_fd, std::size_t max_line)
    : prefix_(std::move(prefix)),
      sink_fd_(sink_fd),
      log_fd_(log_fd),
      max_line_(max_line > 0 ? max_line : kMaxLine) {}

void OutputPump::feed(std::string_view data) {
  partial_.append(data.data(), data.size());
  const std::size_t last_newline = partial_.rfind('\n');
  if (last_newline != std::string::npos) {
    emitLines(std::string_view(partial_).substr(0, last_newline + 1));
    partial_.erase(0, last_newline + 1);
  }
  // Cut overlong lines at exactly max_line_ bytes, so the split does not depend on how the
  // kernel happened to chunk the pipe's data.
  while (partial_.size() >= max_line_) {
    std::string piece = partial_.substr(0, max_line_);
    piece += '\n';
    emitLines(piece);
    partial_.erase(0, max_line_);
  }
}

void OutputPump::finish() {
  if (partial_.empty()) return;
  partial_ += '\n';
  emitLines(partial_);
  partial_.clear();
}

void OutputPump::emitLines(std::string_view lines) {
  writeLog(lines);
  if (sink_fd_ < 0 || sink_failed_) return;
  // Whole lines are batched up to PIPE_BUF bytes: one write() per batch keeps the syscall count
  // low, and a write of at most PIPE_BUF bytes to a pipe is atomic, so no line is torn apart.
  std::string batch;
  std::size_t start = 0;
  while (start < lines.size()) {
    const std::size_t end = lines.find('\n', start) + 1;  // `lines` ends with '\n'
    const std::size_t line_size = prefix_.size() + (end - start);
    if (!batch.empty() && batch.size() + line_size > PIPE_BUF) {
      writeSink(batch);
      batch.clear();
    }
    batch += prefix_;
    batch.append(lines.data() + start, end - start);
    start = end;
  }
  if (!batch.empty()) writeSink(batch);
}

void OutputPump::writeSink(const std::string& batch) {
  if (sink_failed_) return;
  if (!writeAll(sink_fd_, batch.data(), batch.size())) sink_failed_ = true;
}

void OutputPump::writeLog(std::string_view lines) {
  if (log_fd_ < 0 || log_failed_) return;
  if (!writeAll(log_fd_, lines.data(), lines.size())) {
    log_failed_ = true;
    logWarn("cannot write worker output to its log file (", ::strerror(errno),
            "); further output of this stream is not logged");
  }
}

}  // namespace chorus::runtime
