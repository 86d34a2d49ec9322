// Private helpers of the worker supervisor: writing whole buffers, and the output pump that turns
// one stream of a worker's output into whole, prefixed lines.
//
// The agent copies every worker's stdout and stderr to its own. Several workers write at once, so
// the pump only ever emits whole lines, each inside one write(): a line shorter than PIPE_BUF can
// then never be torn apart by another worker's line, or by another agent sharing the same
// terminal or pipe (srun, mpirun). Not part of the public API.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "chorus/core/unique_fd.h"

namespace chorus::runtime {

// Writes all of `size` bytes, retrying on EINTR, on short writes and (for a non-blocking
// descriptor) after waiting for it to become writable. Returns false, with errno set, on any
// other error, e.g. EPIPE when the reader has gone (SIGPIPE must be ignored by the caller).
bool writeAll(int fd, const char* data, std::size_t size);

// Splits one output stream of one worker into lines and copies them to a sink (the agent's stdout
// or stderr, each line prefixed, e.g. "[rank 3] ") and, unprefixed, to the rank's log file.
// Does not own the descriptors. Not thread-safe: one pump per stream, fed by one thread.
class OutputPump {
 public:
  // A partial line longer than this is emitted as a line of its own (with a '\n' added), so a
  // worker that never prints a newline cannot make the agent buffer without bound.
  static constexpr std::size_t kMaxLine = 64 * 1024;

  // `sink_fd` or `log_fd` may be -1 to drop that copy. `prefix` is put in front of every line
  // written to the sink (may be empty); the log file always gets the bare lines.
  OutputPump(std::string prefix, int sink_fd, int log_fd, std::size_t max_line = kMaxLine);

  // Takes the next bytes of the stream; writes every line they complete.
  void feed(std::string_view data);
  // The stream ended: writes a final partial line, adding the missing '\n'. Idempotent.
  void finish();

 private:
  // Emits `lines`, which holds only whole lines (each ending in '\n').
  void emitLines(std::string_view lines);
  void writeSink(const std::string& batch);
  void writeLog(std::string_view lines);

  std::string prefix_;
  int sink_fd_;
  int log_fd_;
  std::size_t max_line_;
  std::string partial_;  // bytes after the last '\n' seen, at most max_line_ - 1 of them
  // Set once a write failed (e.g. the agent's stdout was closed by `| head`, or the log's disk is
  // full): that copy of the output is then dropped instead of failing the job.
  bool sink_failed_ = false;
  bool log_failed_ = false;
};

}  // namespace chorus::runtime
