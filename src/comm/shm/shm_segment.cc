#include "shm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "chorus/core/error.h"
#include "chorus/core/unique_fd.h"

namespace chorus::comm {
namespace {

constexpr std::uint64_t kMagic = 0x63686f7275736d31ULL;  // "chorusm1"
constexpr std::size_t kAlign = 64;
constexpr std::size_t kHeaderBytes = 4096;

struct ShmHeader {
  std::uint64_t magic;
  std::uint64_t size;
  std::uint64_t chunk_bytes;
  std::uint64_t total_bytes;
};

std::size_t roundUp(std::size_t value, std::size_t to) { return (value + to - 1) / to * to; }

std::string errnoText(int error) { return std::strerror(error); }

void* mapShared(int fd, std::size_t bytes, const std::string& name) {
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED)
    CHORUS_THROW(CommError, "shm segment ", name, ": mmap of ", bytes,
                 " bytes failed: ", errnoText(errno));
  return base;
}

void initRobustMutex(pthread_mutex_t* mutex) {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  const int error = pthread_mutex_init(mutex, &attr);
  pthread_mutexattr_destroy(&attr);
  if (error != 0)
    CHORUS_THROW(CommError, "shm segment: robust mutex init failed: ", errnoText(error));
}

}  // namespace

std::size_t ShmSegment::controlStride(int size) {
  return roundUp(sizeof(ShmRankControl) + 2 * sizeof(std::int64_t) * static_cast<std::size_t>(size),
                 kAlign);
}

std::size_t ShmSegment::totalBytes(int size, std::size_t chunk_bytes) {
  const std::size_t controls = roundUp(controlStride(size) * static_cast<std::size_t>(size), 4096);
  return kHeaderBytes + controls + 2 * chunk_bytes * static_cast<std::size_t>(size);
}

ShmSegment::ShmSegment(void* base, std::size_t bytes, int size, std::size_t chunk_bytes)
    : base_(static_cast<std::byte*>(base)), bytes_(bytes), size_(size), chunk_bytes_(chunk_bytes) {}

ShmSegment::~ShmSegment() { ::munmap(base_, bytes_); }

std::unique_ptr<ShmSegment> ShmSegment::create(const std::string& name, int size,
                                               std::size_t chunk_bytes) {
  if (chunk_bytes == 0 || chunk_bytes % kAlign != 0)
    CHORUS_THROW(ConfigError, "shm chunk size ", chunk_bytes, " must be a positive multiple of ",
                 kAlign);
  UniqueFd fd(::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600));
  if (fd.get() < 0)
    CHORUS_THROW(CommError, "shm segment ", name, ": create failed: ", errnoText(errno));
  const std::size_t bytes = totalBytes(size, chunk_bytes);
  // posix_fallocate reserves the pages now: a tmpfs without room fails here with ENOSPC instead
  // of killing the process with SIGBUS at the first touch of a missing page.
  int error = ::ftruncate(fd.get(), static_cast<off_t>(bytes)) == 0 ? 0 : errno;
  if (error == 0) error = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(bytes));
  if (error != 0) {
    ::shm_unlink(name.c_str());
    CHORUS_THROW(CommError, "shm segment ", name, ": reserving ", bytes,
                 " bytes failed: ", errnoText(error));
  }
  std::unique_ptr<ShmSegment> segment(
      new ShmSegment(mapShared(fd.get(), bytes, name), bytes, size, chunk_bytes));
  for (int rank = 0; rank < size; ++rank) {
    ShmRankControl* control = new (&segment->control(rank)) ShmRankControl{};
    control->cpu.store(kShmUnknownCpu);
    initRobustMutex(&control->alive);
  }
  auto* header = reinterpret_cast<ShmHeader*>(segment->base_);
  header->size = static_cast<std::uint64_t>(size);
  header->chunk_bytes = chunk_bytes;
  header->total_bytes = bytes;
  // The magic last: a peer that sees it sees an initialized segment (it opens only after rank 0
  // published the name through the store, which orders these writes before its reads anyway).
  std::atomic_thread_fence(std::memory_order_release);
  header->magic = kMagic;
  return segment;
}

std::unique_ptr<ShmSegment> ShmSegment::open(const std::string& name, int size,
                                             std::size_t chunk_bytes) {
  UniqueFd fd(::shm_open(name.c_str(), O_RDWR, 0600));
  if (fd.get() < 0)
    CHORUS_THROW(CommError, "shm segment ", name, ": open failed: ", errnoText(errno));
  struct stat info {};
  const std::size_t bytes = totalBytes(size, chunk_bytes);
  if (::fstat(fd.get(), &info) != 0 || static_cast<std::size_t>(info.st_size) != bytes)
    CHORUS_THROW(CommError, "shm segment ", name, ": has ", info.st_size, " bytes, expected ",
                 bytes);
  std::unique_ptr<ShmSegment> segment(
      new ShmSegment(mapShared(fd.get(), bytes, name), bytes, size, chunk_bytes));
  const auto* header = reinterpret_cast<const ShmHeader*>(segment->base_);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (header->magic != kMagic || header->size != static_cast<std::uint64_t>(size) ||
      header->chunk_bytes != chunk_bytes)
    CHORUS_THROW(CommError, "shm segment ", name, ": header does not match (size ", header->size,
                 ", chunk ", header->chunk_bytes, "; expected ", size, ", ", chunk_bytes, ")");
  return segment;
}

void ShmSegment::unlink(const std::string& name) { ::shm_unlink(name.c_str()); }

ShmRankControl& ShmSegment::control(int rank) const {
  return *reinterpret_cast<ShmRankControl*>(base_ + kHeaderBytes +
                                            controlStride(size_) * static_cast<std::size_t>(rank));
}

std::int64_t* ShmSegment::counts(int rank, int parity) const {
  return reinterpret_cast<std::int64_t*>(reinterpret_cast<std::byte*>(&control(rank)) +
                                         sizeof(ShmRankControl)) +
         static_cast<std::size_t>(parity) * static_cast<std::size_t>(size_);
}

std::byte* ShmSegment::buffer(int rank, int parity) const {
  const std::size_t controls =
      roundUp(controlStride(size_) * static_cast<std::size_t>(size_), 4096);
  return base_ + kHeaderBytes + controls +
         chunk_bytes_ * (2 * static_cast<std::size_t>(rank) + static_cast<std::size_t>(parity));
}

}  // namespace chorus::comm
