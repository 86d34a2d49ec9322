// Owns a file descriptor: closes it on every path out of the scope that opened it.
#pragma once

namespace chorus {

// Owns one file descriptor and closes it on destruction. Move-only; not thread-safe.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  // The descriptor; negative when none is held (the call that opened it failed).
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives the descriptor up without closing it.
  int release();
  // Closes the held descriptor (if any) and takes `fd` instead.
  void reset(int fd = -1);
  // Closes the held descriptor now and returns close()'s result: close() can report a deferred
  // write error (NFS), which a writer must check.
  int close();

 private:
  int fd_ = -1;
};

}  // namespace chorus
