// Gradient compression: codecs that shrink what crosses a (slow) link, the compressed all-reduce
// built on them, and error feedback.
//
// Codecs and their error bounds (x: one rank's fp32 tensor, x̂: what the other ranks decode):
//   none      plain fp32 all-reduce; exact up to reduction order.
//   fp16      x/n rounded to IEEE half, all-reduced in half (as PyTorch's fp16 hook), times n.
//             Per rank |x − x̂| ≤ 2^-11 |x| while |x/n| lies in [2^-14, 65504] (values beyond
//             are clamped to ±65504·n; below, absolute error ≤ 2^-25·n). The half-precision sum
//             adds at most (n−1) further roundings: |Σx − result| ≤ n·2^-11·Σ|x| (first order).
//   bf16      as fp16 with bfloat16: |x − x̂| ≤ 2^-8 |x| (fp32's range: no clamping);
//             |Σx − result| ≤ n·2^-8·Σ|x|.
//   int8      per chunk of `int8_chunk` elements, scale = max|x|/127 and q = round(x/scale):
//             |x − x̂| ≤ scale/2 per chunk. All-gathered (bytes: 1 per element + 4 per chunk);
//             each rank decodes and sums the n contributions in rank order in fp32.
//   topk      the k = max(1, ceil(ratio·N)) largest |x|, as (int32 index, fp32 value) pairs: kept
//             elements are exact, dropped ones have |x| ≤ the smallest kept |x|, and
//             ‖x − x̂‖² ≤ (1 − k/N)‖x‖². All-gathered, decoded and summed as int8.
//   powersgd  rank-r approximation (Vogels et al., NeurIPS 2019): per matrix M (a tensor viewed
//             as [dim0, rest]), P = M Q, all-reduce P, orthonormalize P, Q = Mᵀ P, all-reduce Q,
//             M̂ = P Qᵀ; Q is kept for the next step (warm start), `powersgd_iterations` times
//             per call. Exact (to fp32 rounding: 6e-6 relative at 4096×4096; bf16 factors: 2^-8)
//             for matrices of rank ≤ r, rank-deficient ones included: dependent columns of P are
//             zeroed, not normalized; otherwise ‖M − M̂‖ tends to the best rank-r error as the
//             warm-started iterations converge. 1-D tensors, small tensors and matrices where
//             ab < min_compression_rate·r(a+b) travel uncompressed in the first P all-reduce.
//
// Error feedback (Seide et al. 2014; Karimireddy et al. 2019): each lossy codec keeps, per tensor
// key, what compression dropped (x + e − x̂) and adds it to the next step's tensor of that key, so
// the dropped part is delayed, not lost: the running sum of decoded updates tracks the true
// running sum within one step's error.
//
// Every rank ends a compressed all-reduce with bitwise the same result: the reductions happen in
// one collective, or locally in rank order on identical gathered inputs, and the local steps
// (decoding, orthonormalization) are deterministic CPU code.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "chorus/comm/communicator.h"
#include "chorus/core/collective_kinds.h"

namespace chorus::parallel {

// The codecs and their options are core's vocabulary (core/collective_kinds.h), shared with the
// plan, which carries them to the runtime; these keep
// the parallel:: spelling of the call sites that name them through this layer.
using chorus::CodecKind;
using chorus::CodecOptions;
using chorus::parseCodecKind;

// A lossy encoding of a flat fp32 tensor. Value type.
struct EncodedTensor {
  at::Tensor payload;      // what would be sent (its dtype is the codec's business)
  std::int64_t numel = 0;  // elements of the tensor it encodes
  std::int64_t bytes() const;
};

// Stateless element-wise codecs (fp16, bf16, int8, top-k), shared by the compressed all-reduce,
// the tests of their bounds and the benchmark. Thread-safe (no state).
class ElementCodec {
 public:
  virtual ~ElementCodec() = default;
  virtual const char* name() const = 0;
  // `flat`: 1-D contiguous fp32.
  virtual EncodedTensor encode(const at::Tensor& flat) const = 0;
  virtual at::Tensor decode(const EncodedTensor& encoded) const = 0;
  // Bytes of encode(x) for every x of `numel` elements (gathers need equal sizes on all ranks).
  virtual std::int64_t encodedBytes(std::int64_t numel) const = 0;
};

// kFp16, kBf16, kInt8 or kTopK; ConfigError for the others or bad options.
std::unique_ptr<ElementCodec> makeElementCodec(const CodecOptions& options);

// Which slice of a flat buffer holds which tensor, so shape-aware codecs (PowerSGD) see matrices
// and keep their memory per tensor. Value type.
struct FlatLayout {
  struct Entry {
    std::string key;  // stable across steps, e.g. "param12"
    std::int64_t offset = 0;
    std::vector<std::int64_t> shape;
    std::int64_t numel() const;
  };
  std::vector<Entry> entries;

  // One entry covering all of `flat`, shaped like it.
  static FlatLayout whole(const std::string& key, const at::Tensor& flat);
};

// Residual memory per tensor key. Not thread-safe; owned by one codec.
class ErrorFeedback {
 public:
  // x + the residual stored for `key` (a new tensor; x itself when none is stored or its shape
  // differs, e.g. after the model changed).
  at::Tensor compensate(const std::string& key, const at::Tensor& x) const;
  // Stores compensated − transmitted as the residual of `key`.
  void update(const std::string& key, const at::Tensor& compensated, const at::Tensor& transmitted);
  const std::map<std::string, at::Tensor>& residuals() const { return residuals_; }
  // The stored residual of `key` when it has `like`'s shape, for codecs that update it in place
  // (no allocation per call); null otherwise.
  at::Tensor* residualFor(const std::string& key, const at::Tensor& like);
  void setResidual(const std::string& key, at::Tensor residual);
  void erase(const std::string& key) { residuals_.erase(key); }
  void clear() { residuals_.clear(); }

 private:
  std::map<std::string, at::Tensor> residuals_;
};

// What a codec sent, for reports such as "10× fewer bytes". Bytes are this rank's. Value type.
struct CompressionStats {
  std::uint64_t calls = 0;
  // fp32 bytes of the tensors all-reduced.
  std::uint64_t raw_bytes = 0;
  // Bytes handed to the collectives (the Communicator's own byte count).
  std::uint64_t payload_bytes = 0;
  // Bytes this rank sends under ring algorithms: all-reduce 2(n−1)/n·S, all-gather (n−1)·S.
  std::uint64_t wire_bytes = 0;
  // What a plain fp32 ring all-reduce of the same tensors would send.
  std::uint64_t raw_wire_bytes = 0;

  // raw_wire_bytes / wire_bytes (1 when nothing was sent).
  double wireRatio() const;
};

// A compressed all-reduce with its memory (residuals, PowerSGD's Q). Not thread-safe: one thread
// at a time (the gradient reducer's helper during a step, the trainer's thread for state() and
// loadState() between steps). Non-copyable.
class GradientCodec {
 public:
  explicit GradientCodec(CodecOptions options) : options_(std::move(options)) {}
  virtual ~GradientCodec() = default;
  GradientCodec(const GradientCodec&) = delete;
  GradientCodec& operator=(const GradientCodec&) = delete;

  const CodecOptions& options() const { return options_; }
  const char* name() const { return toString(options_.kind); }

  // Collective over `comm` (every rank calls it with the same key, layout and buffer size, in the
  // same order): on return `flat` (1-D contiguous fp32) holds the sum over ranks of each rank's
  // decoded contribution. Blocks; each collective is bound by the communicator's deadline.
  virtual void allReduce(const std::string& key, at::Tensor& flat, const FlatLayout& layout,
                         comm::Communicator& comm) = 0;

  // A reduce-scatter launched in the codec's format (ZeRO's gradient reduce-scatter). Value type.
  struct Scatter {
    comm::Work work;
    // Writes this rank's decoded sum into the output; call once `work` finished.
    std::function<void()> complete;
  };
  // Whether reduceScatter() compresses: element-wise codecs whose sum can be formed in their own
  // format (fp16, bf16). Default: false.
  virtual bool compressesReduceScatter() const { return false; }
  // Collective over `comm`, like Communicator::reduceScatterV(flat, output, counts): `flat` (1-D
  // fp32, error feedback under `key`) goes out as x/n in the codec's format, every rank's slice is
  // summed in it, and complete() writes n × the sum into `output` (fp32, counts[rank] elements).
  // Error bound as the codec's all-reduce. Throws ConfigError unless compressesReduceScatter().
  virtual Scatter reduceScatter(const std::string& key, const at::Tensor& flat, at::Tensor output,
                                const std::vector<std::int64_t>& counts, comm::Communicator& comm);

  // Drops the memory that allReduce(key, …, layout) keeps (the residuals of `key` and of the
  // layout's entries, PowerSGD's Q of its matrices), which then starts afresh. For a call whose
  // result was not finite (an fp16 overflow somewhere: the step is skipped): a residual or a
  // warm-started Q holding inf or NaN would poison every later step. Every rank sees the same
  // result, so every rank forgets together.
  virtual void forget(const std::string& key, const FlatLayout& layout);

  // The memory, for checkpoints: "residual/<key>" and (PowerSGD) "q/<key>" tensors, and
  // "calls/<key>" while PowerSGD's start_step counts.
  virtual std::map<std::string, at::Tensor> state() const;
  // Replaces the memory with a state() taken earlier (unknown prefixes: ConfigError).
  virtual void loadState(const std::map<std::string, at::Tensor>& state);

  const CompressionStats& stats() const { return stats_; }

 protected:
  // Records one collective of `payload` bytes over `ranks` ranks for a tensor of `raw` bytes
  // (raw 0 for the second collective of one call).
  void countAllReduce(std::int64_t payload, int ranks, std::int64_t raw);
  void countAllGather(std::int64_t payload, int ranks, std::int64_t raw);
  // A reduce-scatter sends (n−1)/n of its input.
  void countReduceScatter(std::int64_t payload, int ranks, std::int64_t raw);

  CodecOptions options_;
  ErrorFeedback feedback_;
  CompressionStats stats_;
};

// The codec of options.kind.
std::unique_ptr<GradientCodec> makeCodec(const CodecOptions& options);

}  // namespace chorus::parallel
