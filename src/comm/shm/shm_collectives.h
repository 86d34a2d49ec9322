// Private to comm: the collective algorithms of the shared-memory transport.
//
// Every algorithm moves data through the ranks' chunk buffers in steps: each rank copies its
// part of the step into its own buffer, all ranks meet at a barrier, then each reads what it
// needs from the others' buffers. Buffers alternate between two parities, so a rank fills the
// next step's buffer while slower peers still read the previous one; one barrier per step is
// then enough. Large tensors take as many steps as they need, so the segment stays bounded.
//
//   all-reduce       per chunk: copy in the slices that the peers reduce; barrier; rank r
//                    reduces slice r (its own tensor and the peers' buffers) into its tensor and
//                    its buffer in one pass; barrier; copy the other slices out
//                    (reduce-scatter + all-gather over shared memory, (n-1)/n copied each way)
//   broadcast        root copies in; barrier; the others copy out
//   all-gather(V)    each copies its piece in; barrier; each copies every other piece out
//   reduce-scatter(V) each copies piece j of every block into slot j; barrier; rank r reduces
//                    slot r of every buffer into its output
//   all-to-all       counts through the control blocks, then as reduce-scatter without reduction
//
// Reductions run in rank order on one rank per element, so every rank gets bitwise the same
// result. The first step of each operation also checks that all ranks issued the same operation.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "chorus/comm/communicator.h"
#include "shm/shm_segment.h"
#include "shm/shm_sync.h"

namespace chorus::comm {

// The algorithms of one rank. Not thread-safe: used by one thread at a time, whichever runs the
// rank's operations (the caller's or the transport's; ShmWorkQueue hands them over in order).
// REQUIRES: contiguous CPU tensors whose sizes the Communicator validated.
class ShmCollectives {
 public:
  ShmCollectives(const ShmSegment& segment, ShmSync& sync, int rank);
  ShmCollectives(const ShmCollectives&) = delete;
  ShmCollectives& operator=(const ShmCollectives&) = delete;

  void allReduce(const ShmWaitContext& context, at::Tensor& tensor, ReduceOp op);
  void broadcast(const ShmWaitContext& context, at::Tensor& tensor, int root);
  void allGatherV(const ShmWaitContext& context, const at::Tensor& input, at::Tensor& output,
                  const std::vector<int64_t>& counts);
  void reduceScatterV(const ShmWaitContext& context, const at::Tensor& input, at::Tensor& output,
                      const std::vector<int64_t>& counts, ReduceOp op);
  void allToAll(const ShmWaitContext& context, const at::Tensor& input, at::Tensor& output,
                const std::vector<int64_t>& send_counts, const std::vector<int64_t>& recv_counts);
  void barrier(const ShmWaitContext& context);

 private:
  // Records this rank's view of the operation for the peers to compare (before the first
  // barrier), and compares theirs (after it).
  void publish(const ShmWaitContext& context, std::uint64_t digest);
  void verify(const ShmWaitContext& context);
  // Ends an operation: the next one uses the other set of digests and counts.
  void close() { ++ops_; }
  std::byte* buffer(int rank) const { return segment_.buffer(rank, parity_); }
  void nextBuffer() { parity_ ^= 1; }
  // Elements of one chunk buffer; of one per-destination slot within it.
  int64_t chunkElements(std::size_t element_size) const;
  int64_t slotElements(std::size_t element_size) const;

  const ShmSegment& segment_;
  ShmSync& sync_;
  int rank_;
  int size_;
  std::uint64_t ops_ = 0;
  int parity_ = 0;
};

}  // namespace chorus::comm
