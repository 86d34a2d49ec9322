// The dense codecs, all-reduced as they are: none (fp32, the baseline) and fp16/bf16, a cast to a
// 16-bit float with the all-reduce carried out in that precision.
//
// Why all-reduce in 16 bits rather than all-gather and sum in fp32: a ring all-reduce sends
// 2(n−1)/n·S per rank whatever n, an all-gather (n−1)·S, so for n > 2 gathering 16-bit values
// sends MORE than an fp32 all-reduce. The price is rounding in the sum, bounded in the header;
// dividing by n first (as PyTorch's fp16 hook does) keeps fp16's sum from overflowing.
#include <ATen/ATen.h>

#include "chorus/core/error.h"
#include "compression_internal.h"

namespace chorus::parallel::detail {
namespace {

constexpr double kHalfMax = 65504.0;

// Plain fp32 all-reduce: the baseline the others are measured against.
class NoneCodec : public GradientCodec {
 public:
  using GradientCodec::GradientCodec;
  void allReduce(const std::string&, at::Tensor& flat, const FlatLayout&,
                 comm::Communicator& comm) override {
    comm.allReduce(flat).wait();
    countAllReduce(static_cast<std::int64_t>(flat.nbytes()), comm.size(),
                   static_cast<std::int64_t>(flat.nbytes()));
  }
};

// Rounds to the 16-bit type; fp16 saturates instead of overflowing to infinity.
at::Tensor toLow(const at::Tensor& x, CodecKind kind) {
  if (kind == CodecKind::kFp16) return x.clamp(-kHalfMax, kHalfMax).to(at::kHalf);
  return x.to(at::kBFloat16);
}

class FloatElementCodec : public ElementCodec {
 public:
  explicit FloatElementCodec(CodecKind kind) : kind_(kind) {}
  const char* name() const override { return toString(kind_); }
  EncodedTensor encode(const at::Tensor& flat) const override {
    return {toLow(flat, kind_), flat.numel()};
  }
  at::Tensor decode(const EncodedTensor& encoded) const override {
    return encoded.payload.to(at::kFloat);
  }
  std::int64_t encodedBytes(std::int64_t numel) const override { return 2 * numel; }

 private:
  CodecKind kind_;
};

class FloatCodec : public GradientCodec {
 public:
  using GradientCodec::GradientCodec;

  void allReduce(const std::string& key, at::Tensor& flat, const FlatLayout&,
                 comm::Communicator& comm) override {
    // In place wherever possible: on large buckets every pass over fresh memory costs page
    // faults, and the codec must stay cheaper than the bytes it saves on the slow link.
    const int ranks = comm.size();
    const bool feedback = options_.error_feedback;
    at::Tensor* residual = feedback ? feedback_.residualFor(key, flat) : nullptr;
    const at::Tensor x = residual ? residual->add_(flat) : flat;  // compensated
    at::Tensor scaled = at::div(x, ranks);
    if (options_.kind == CodecKind::kFp16) scaled.clamp_(-kHalfMax, kHalfMax);
    at::Tensor low = scaled.to(options_.kind == CodecKind::kFp16 ? at::kHalf : at::kBFloat16);
    if (feedback) {
      scaled.copy_(low).mul_(ranks);  // what is sent, in fp32
      if (residual)
        residual->sub_(scaled);
      else
        feedback_.setResidual(key, flat - scaled);
    }
    comm.allReduce(low).wait();
    flat.copy_(low).mul_(ranks);
    countAllReduce(static_cast<std::int64_t>(low.nbytes()), ranks,
                   static_cast<std::int64_t>(flat.nbytes()));
  }

  bool compressesReduceScatter() const override { return true; }

  Scatter reduceScatter(const std::string& key, const at::Tensor& flat, at::Tensor output,
                        const std::vector<std::int64_t>& counts,
                        comm::Communicator& comm) override {
    const int ranks = comm.size();
    const at::ScalarType format = options_.kind == CodecKind::kFp16 ? at::kHalf : at::kBFloat16;
    const at::Tensor x = options_.error_feedback ? feedback_.compensate(key, flat) : flat;
    at::Tensor scaled = at::div(x, ranks);
    if (options_.kind == CodecKind::kFp16) scaled.clamp_(-kHalfMax, kHalfMax);
    const at::Tensor low = scaled.to(format);
    if (options_.error_feedback) {
      // A non-finite gradient (an fp16 overflow: the step is skipped) must not live on in the
      // residual; each rank sees only its own slice of the sum, so each looks at its own input.
      if (at::isfinite(x).all().item<bool>())
        feedback_.update(key, x, low.to(at::kFloat).mul_(ranks));
      else
        feedback_.erase(key);
    }
    at::Tensor summed = at::empty({counts.at(comm.rank())}, low.options());
    Scatter scatter;
    scatter.work = comm.reduceScatterV(low, summed, counts, comm::ReduceOp::kSum);
    scatter.complete = [summed, output, ranks]() mutable { output.copy_(summed).mul_(ranks); };
    countReduceScatter(static_cast<std::int64_t>(low.nbytes()), ranks,
                       static_cast<std::int64_t>(flat.nbytes()));
    return scatter;
  }
};

}  // namespace

std::unique_ptr<GradientCodec> makeNoneCodec(const CodecOptions& options) {
  return std::make_unique<NoneCodec>(options);
}

std::unique_ptr<ElementCodec> makeFloatElementCodec(CodecKind kind) {
  if (kind != CodecKind::kFp16 && kind != CodecKind::kBf16)
    CHORUS_THROW(ConfigError, "not a 16-bit float codec: ", toString(kind));
  return std::make_unique<FloatElementCodec>(kind);
}

std::unique_ptr<GradientCodec> makeFloatCodec(const CodecOptions& options) {
  makeFloatElementCodec(options.kind);  // validates the kind
  return std::make_unique<FloatCodec>(options);
}

}  // namespace chorus::parallel::detail
