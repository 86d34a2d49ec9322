#include "shm/shm_collectives.h"

#include <algorithm>
#include <cstring>

#include "chorus/core/error.h"
#include "shm/shm_kernels.h"

namespace chorus::comm {
namespace {

// Slices of a chunk start on cache-line boundaries, so two ranks never write one line.
constexpr int64_t kLineBytes = 64;

enum class Kind : std::uint64_t {
  kAllReduce = 1,
  kBroadcast,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kBarrier
};

// FNV-1a over the words that every rank must agree on.
std::uint64_t digestOf(std::initializer_list<std::uint64_t> words,
                       const std::vector<int64_t>& counts = {}) {
  std::uint64_t hash = 1469598103934665603ULL;
  auto mix = [&hash](std::uint64_t word) {
    for (int byte = 0; byte < 8; ++byte) {
      hash ^= (word >> (8 * byte)) & 0xff;
      hash *= 1099511628211ULL;
    }
  };
  for (std::uint64_t word : words) mix(word);
  for (int64_t count : counts) mix(static_cast<std::uint64_t>(count));
  return hash;
}

std::uint64_t word(c10::ScalarType type) { return static_cast<std::uint64_t>(type); }
std::uint64_t word(ReduceOp op) { return static_cast<std::uint64_t>(op); }

int64_t clampTo(int64_t value, int64_t limit) {
  return std::max<int64_t>(0, std::min(value, limit));
}

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::vector<int64_t> offsetsOf(const std::vector<int64_t>& counts) {
  std::vector<int64_t> offsets(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) offsets[i + 1] = offsets[i] + counts[i];
  return offsets;
}

// memcpy that accepts empty ranges (whose pointers may be null or one past the end).
void copyBytes(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, static_cast<std::size_t>(bytes));
}

std::byte* bytesOf(const at::Tensor& tensor) { return static_cast<std::byte*>(tensor.data_ptr()); }

}  // namespace

ShmCollectives::ShmCollectives(const ShmSegment& segment, ShmSync& sync, int rank)
    : segment_(segment), sync_(sync), rank_(rank), size_(segment.size()) {}

int64_t ShmCollectives::chunkElements(std::size_t element_size) const {
  return static_cast<int64_t>(segment_.chunkBytes() / element_size);
}

int64_t ShmCollectives::slotElements(std::size_t element_size) const {
  const int64_t line = kLineBytes / static_cast<int64_t>(element_size);
  const int64_t slot = chunkElements(element_size) / size_;
  return slot >= line ? slot / line * line : std::max<int64_t>(1, slot);
}

void ShmCollectives::publish(const ShmWaitContext& context, std::uint64_t digest) {
  ShmRankControl& mine = segment_.control(rank_);
  mine.op_sequence[ops_ % 2].store(context.sequence, std::memory_order_relaxed);
  mine.op_digest[ops_ % 2].store(digest, std::memory_order_relaxed);
}

void ShmCollectives::verify(const ShmWaitContext& context) {
  const ShmRankControl& mine = segment_.control(rank_);
  const std::uint64_t digest = mine.op_digest[ops_ % 2].load(std::memory_order_relaxed);
  for (int peer = 0; peer < size_; ++peer) {
    const ShmRankControl& theirs = segment_.control(peer);
    const long long sequence = theirs.op_sequence[ops_ % 2].load(std::memory_order_relaxed);
    if (sequence != context.sequence ||
        theirs.op_digest[ops_ % 2].load(std::memory_order_relaxed) != digest)
      CHORUS_THROW(CommError, context.operation, " #", context.sequence,
                   ": ranks disagree on the operation (group rank ", peer,
                   " issued a different operation, type, size or reduction as its #", sequence,
                   "); every rank must issue the same collectives in the same order");
  }
}

void ShmCollectives::allReduce(const ShmWaitContext& context, at::Tensor& tensor, ReduceOp op) {
  const c10::ScalarType type = tensor.scalar_type();
  const std::size_t element = tensor.element_size();
  const int64_t total = tensor.numel();
  const int64_t chunk = chunkElements(element);
  const int64_t line = std::max<int64_t>(1, kLineBytes / static_cast<int64_t>(element));
  std::byte* data = bytesOf(tensor);
  std::vector<const void*> sources(size_);
  publish(context, digestOf({static_cast<std::uint64_t>(Kind::kAllReduce), word(type), word(op),
                             static_cast<std::uint64_t>(total)}));
  for (int64_t offset = 0; offset < total; offset += chunk) {
    const int64_t len = std::min(chunk, total - offset);
    std::byte* chunk_data = data + offset * element;
    const int64_t slice = ceilDiv(ceilDiv(len, size_), line) * line;
    auto lowOf = [&](int rank) { return std::min(len, rank * slice); };
    auto countOf = [&](int rank) { return std::min(len, lowOf(rank) + slice) - lowOf(rank); };
    // Publish only the slices that peers reduce; this rank reads its own slice from its tensor.
    for (int peer = 0; peer < size_; ++peer)
      if (peer != rank_)
        copyBytes(buffer(rank_) + lowOf(peer) * element, chunk_data + lowOf(peer) * element,
                  countOf(peer) * element);
    sync_.barrier(context);
    if (offset == 0) verify(context);
    const int64_t lo = lowOf(rank_);
    for (int peer = 0; peer < size_; ++peer)
      sources[peer] = peer == rank_ ? chunk_data + lo * element : buffer(peer) + lo * element;
    // In place in the tensor, and published in this rank's buffer for the peers to copy out.
    if (countOf(rank_) > 0)
      shmReduce(type, op, sources.data(), size_, chunk_data + lo * element,
                buffer(rank_) + lo * element, static_cast<std::size_t>(countOf(rank_)));
    sync_.barrier(context);
    for (int peer = 0; peer < size_; ++peer)
      if (peer != rank_)
        copyBytes(chunk_data + lowOf(peer) * element, buffer(peer) + lowOf(peer) * element,
                  countOf(peer) * element);
    nextBuffer();
  }
  close();
}

void ShmCollectives::broadcast(const ShmWaitContext& context, at::Tensor& tensor, int root) {
  const int64_t total = static_cast<int64_t>(tensor.nbytes());
  const int64_t chunk = static_cast<int64_t>(segment_.chunkBytes());
  std::byte* data = bytesOf(tensor);
  publish(context,
          digestOf({static_cast<std::uint64_t>(Kind::kBroadcast), word(tensor.scalar_type()),
                    static_cast<std::uint64_t>(root), static_cast<std::uint64_t>(total)}));
  const int64_t steps = std::max<int64_t>(1, ceilDiv(total, chunk));
  for (int64_t step = 0; step < steps; ++step) {
    const int64_t offset = step * chunk;
    const int64_t len = clampTo(total - offset, chunk);
    if (rank_ == root) copyBytes(buffer(root), data + offset, len);
    sync_.barrier(context);
    if (step == 0) verify(context);
    if (rank_ != root) copyBytes(data + offset, buffer(root), len);
    nextBuffer();
  }
  close();
}

void ShmCollectives::allGatherV(const ShmWaitContext& context, const at::Tensor& input,
                                at::Tensor& output, const std::vector<int64_t>& counts) {
  const std::size_t element = input.element_size();
  const int64_t chunk = chunkElements(element);
  const std::vector<int64_t> offsets = offsetsOf(counts);
  const std::byte* in = bytesOf(input);
  std::byte* out = bytesOf(output);
  publish(
      context,
      digestOf({static_cast<std::uint64_t>(Kind::kAllGather), word(input.scalar_type())}, counts));
  copyBytes(out + offsets[rank_] * element, in, counts[rank_] * element);
  const int64_t widest = *std::max_element(counts.begin(), counts.end());
  const int64_t steps = std::max<int64_t>(1, ceilDiv(widest, chunk));
  for (int64_t step = 0; step < steps; ++step) {
    const int64_t lo = step * chunk;
    copyBytes(buffer(rank_), in + lo * element, clampTo(counts[rank_] - lo, chunk) * element);
    sync_.barrier(context);
    if (step == 0) verify(context);
    for (int peer = 0; peer < size_; ++peer) {
      const int64_t len = clampTo(counts[peer] - lo, chunk);
      if (peer != rank_ && len > 0)
        copyBytes(out + (offsets[peer] + lo) * element, buffer(peer), len * element);
    }
    nextBuffer();
  }
  close();
}

void ShmCollectives::reduceScatterV(const ShmWaitContext& context, const at::Tensor& input,
                                    at::Tensor& output, const std::vector<int64_t>& counts,
                                    ReduceOp op) {
  const c10::ScalarType type = input.scalar_type();
  const std::size_t element = input.element_size();
  const int64_t slot = slotElements(element);
  const std::vector<int64_t> offsets = offsetsOf(counts);
  const std::byte* in = bytesOf(input);
  std::byte* out = bytesOf(output);
  std::vector<const void*> sources(size_);
  publish(
      context,
      digestOf({static_cast<std::uint64_t>(Kind::kReduceScatter), word(type), word(op)}, counts));
  const int64_t widest = *std::max_element(counts.begin(), counts.end());
  const int64_t steps = std::max<int64_t>(1, ceilDiv(widest, slot));
  for (int64_t step = 0; step < steps; ++step) {
    const int64_t lo = step * slot;
    for (int peer = 0; peer < size_; ++peer)
      copyBytes(buffer(rank_) + peer * slot * element, in + (offsets[peer] + lo) * element,
                clampTo(counts[peer] - lo, slot) * element);
    sync_.barrier(context);
    if (step == 0) verify(context);
    const int64_t len = clampTo(counts[rank_] - lo, slot);
    for (int peer = 0; peer < size_; ++peer) sources[peer] = buffer(peer) + rank_ * slot * element;
    if (len > 0)
      shmReduce(type, op, sources.data(), size_, out + lo * element, nullptr,
                static_cast<std::size_t>(len));
    nextBuffer();
  }
  close();
}

void ShmCollectives::allToAll(const ShmWaitContext& context, const at::Tensor& input,
                              at::Tensor& output, const std::vector<int64_t>& send_counts,
                              const std::vector<int64_t>& recv_counts) {
  const std::size_t element = input.element_size();
  const int64_t slot = slotElements(element);
  const int parity = static_cast<int>(ops_ % 2);
  std::copy(send_counts.begin(), send_counts.end(), segment_.counts(rank_, parity));
  publish(context,
          digestOf({static_cast<std::uint64_t>(Kind::kAllToAll), word(input.scalar_type())}));
  sync_.barrier(context);
  verify(context);
  int64_t widest = 0;
  for (int peer = 0; peer < size_; ++peer) {
    const int64_t* theirs = segment_.counts(peer, parity);
    if (theirs[rank_] != recv_counts[peer])
      CHORUS_THROW(CommError, context.operation, " #", context.sequence, ": rank ", peer, " sends ",
                   theirs[rank_], " elements to rank ", rank_, ", which expects ",
                   recv_counts[peer]);
    widest = std::max(widest, *std::max_element(theirs, theirs + size_));
  }
  const std::vector<int64_t> in_offsets = offsetsOf(send_counts);
  const std::vector<int64_t> out_offsets = offsetsOf(recv_counts);
  const std::byte* in = bytesOf(input);
  std::byte* out = bytesOf(output);
  copyBytes(out + out_offsets[rank_] * element, in + in_offsets[rank_] * element,
            send_counts[rank_] * element);
  for (int64_t lo = 0; lo < widest; lo += slot) {
    for (int peer = 0; peer < size_; ++peer)
      if (peer != rank_)
        copyBytes(buffer(rank_) + peer * slot * element, in + (in_offsets[peer] + lo) * element,
                  clampTo(send_counts[peer] - lo, slot) * element);
    sync_.barrier(context);
    for (int peer = 0; peer < size_; ++peer) {
      const int64_t len = clampTo(recv_counts[peer] - lo, slot);
      if (peer != rank_ && len > 0)
        copyBytes(out + (out_offsets[peer] + lo) * element, buffer(peer) + rank_ * slot * element,
                  len * element);
    }
    nextBuffer();
  }
  close();
}

void ShmCollectives::barrier(const ShmWaitContext& context) {
  publish(context, digestOf({static_cast<std::uint64_t>(Kind::kBarrier)}));
  sync_.barrier(context);
  verify(context);
  close();
}

}  // namespace chorus::comm
