// Private to comm: a POSIX shared-memory segment that the ranks of one host share for CPU
// collectives, and its layout.
//
// Layout: a header (magic, group size, chunk size), then one control block per rank (arrival
// counter, sleeper count, status, operation signature, send counts, and a robust mutex that the
// rank's transport thread holds while it lives), then per rank two data buffers of chunk_bytes
// each (double buffering: a rank may fill one while peers still read the other).
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace chorus::comm {

// What a rank's control block says about it.
enum ShmStatus : std::uint32_t { kShmActive = 0, kShmLeft = 1, kShmFailed = 2 };
constexpr std::uint32_t kShmUnknownCpu = ~std::uint32_t{0};

// One rank's control block. Lives in shared memory: only lock-free atomics and a process-shared
// robust mutex, so it means the same in every process that maps it.
struct ShmRankControl {
  // Barrier steps this rank completed; the futex word peers sleep on.
  std::atomic<std::uint32_t> arrived;
  // Peers sleeping (futex) on `arrived`; the rank wakes them only when this is non-zero.
  std::atomic<std::uint32_t> sleepers;
  // ShmStatus: a rank that failed an operation or left the group says so, so peers stop waiting.
  std::atomic<std::uint32_t> status;
  // The CPU this rank ran on when it last arrived (kShmUnknownCpu before): a waiter on the same
  // CPU knows the rank cannot arrive while it spins.
  std::atomic<std::uint32_t> cpu;
  // The operation this rank is executing: sequence number and a digest of kind, type and size,
  // compared by peers so that ranks that disagree fail instead of mixing data. Two entries, by
  // parity of the shm operation count: a rank may write the next operation's entry while a peer
  // still reads this one's.
  std::atomic<std::int64_t> op_sequence[2];
  std::atomic<std::uint64_t> op_digest[2];
  // Held by the rank's transport thread from start to end: a peer that finds it free, or
  // abandoned by a dead owner (EOWNERDEAD), knows the rank is gone.
  pthread_mutex_t alive;
};

static_assert(std::atomic<std::uint32_t>::is_always_lock_free, "futex words must be lock-free");
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "shared atomics must be lock-free");

// A mapped segment. Owns the mapping (unmapped on destruction); the name is unlinked explicitly
// once every rank mapped it, so a crash after that leaves nothing behind in /dev/shm.
// Non-copyable; the accessors are thread-safe (they only compute addresses).
class ShmSegment {
 public:
  // Creates, sizes (reserving the memory, so a full /dev/shm fails here, not with SIGBUS later)
  // and maps segment `name`, and initializes header and control blocks. Throws CommError.
  static std::unique_ptr<ShmSegment> create(const std::string& name, int size,
                                            std::size_t chunk_bytes);
  // Maps an existing segment and checks its header against `size` and `chunk_bytes`.
  // Throws CommError.
  static std::unique_ptr<ShmSegment> open(const std::string& name, int size,
                                          std::size_t chunk_bytes);
  // Removes the name (the mappings stay valid); ignores a name that is already gone.
  static void unlink(const std::string& name);

  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  int size() const { return size_; }
  std::size_t chunkBytes() const { return chunk_bytes_; }
  ShmRankControl& control(int rank) const;
  // `size` send counts of `rank` (all-to-all) in its control block; two sets, by `parity`.
  std::int64_t* counts(int rank, int parity) const;
  // Data buffer `parity` (0 or 1) of `rank`, 64-byte aligned, chunkBytes() long.
  std::byte* buffer(int rank, int parity) const;

 private:
  ShmSegment(void* base, std::size_t bytes, int size, std::size_t chunk_bytes);
  static std::size_t controlStride(int size);
  static std::size_t totalBytes(int size, std::size_t chunk_bytes);

  std::byte* base_;
  std::size_t bytes_;
  int size_;
  std::size_t chunk_bytes_;
};

}  // namespace chorus::comm
