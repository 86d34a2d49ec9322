// The all-gathered codecs, int8 and top-k, and their compressed all-reduce.
//
// int8: one fp32 scale per chunk, scale = max|x|/127 over the chunk, q = round(x / scale).
// Payload: the C scales (fp32) then the N codes (int8), N + 4C bytes.
// top-k: the k largest magnitudes. Payload: k fp32 values then k int32 indices, 8k bytes.
//
// The all-reduce: encode (with error feedback), all-gather every rank's payload, decode each and
// sum in rank order. Neither code can be summed in its encoded form (scales differ per rank,
// index sets differ), so the sum happens after decoding; doing it in rank order on identical
// gathered bytes gives every rank the same result bit for bit.
#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "chorus/core/error.h"
#include "compression_internal.h"

namespace chorus::parallel::detail {
namespace {

constexpr double kLevels = 127.0;

class Int8Codec : public ElementCodec {
 public:
  explicit Int8Codec(std::int64_t chunk) : chunk_(chunk) {}
  const char* name() const override { return "int8"; }

  EncodedTensor encode(const at::Tensor& flat) const override {
    const std::int64_t numel = flat.numel();
    const std::int64_t chunks = chunksOf(numel);
    // Pad with zeros to whole chunks: zeros never raise a chunk's maximum.
    at::Tensor padded = at::zeros({chunks * chunk_}, flat.options());
    padded.narrow(0, 0, numel).copy_(flat);
    at::Tensor rows = padded.view({chunks, chunk_});
    at::Tensor scale = rows.abs().amax(1) / kLevels;
    // An all-zero chunk has scale 0: divide by 1 instead, its codes are 0 either way.
    at::Tensor divisor = at::where(scale > 0, scale, at::ones_like(scale));
    at::Tensor codes = (rows / divisor.unsqueeze(1)).round_().clamp_(-kLevels, kLevels);
    at::Tensor q = codes.to(at::kChar).view({-1}).narrow(0, 0, numel);
    return {at::cat({asBytes(scale), asBytes(q)}), numel};
  }

  at::Tensor decode(const EncodedTensor& encoded) const override {
    const std::int64_t numel = encoded.numel;
    const std::int64_t chunks = chunksOf(numel);
    if (encoded.bytes() != encodedBytes(numel))
      CHORUS_THROW(ProtocolError, "int8 payload of ", encoded.bytes(), " bytes for ", numel,
                   " elements");
    // Copies: a slice of a gathered buffer need not be aligned for fp32.
    at::Tensor bytes = encoded.payload.view({-1});
    at::Tensor scale = bytes.narrow(0, 0, 4 * chunks).clone().view(at::kFloat);
    at::Tensor padded = at::zeros({chunks * chunk_}, at::kFloat);
    padded.narrow(0, 0, numel).copy_(bytes.narrow(0, 4 * chunks, numel).view(at::kChar));
    return (padded.view({chunks, chunk_}) * scale.unsqueeze(1)).view({-1}).narrow(0, 0, numel);
  }

  std::int64_t encodedBytes(std::int64_t numel) const override {
    return numel + 4 * chunksOf(numel);
  }

 private:
  std::int64_t chunksOf(std::int64_t numel) const { return (numel + chunk_ - 1) / chunk_; }

  std::int64_t chunk_;
};

}  // namespace

std::unique_ptr<ElementCodec> makeInt8Codec(std::int64_t chunk) {
  if (chunk < 1) CHORUS_THROW(ConfigError, "int8 codec: chunk must be >= 1, got ", chunk);
  return std::make_unique<Int8Codec>(chunk);
}

namespace {

class TopKCodec : public ElementCodec {
 public:
  explicit TopKCodec(double ratio) : ratio_(ratio) {}
  const char* name() const override { return "topk"; }

  EncodedTensor encode(const at::Tensor& flat) const override {
    const std::int64_t numel = flat.numel();
    if (numel > std::numeric_limits<std::int32_t>::max())
      CHORUS_THROW(ConfigError, "topk codec: tensor of ", numel, " elements exceeds int32 indices");
    const std::int64_t k = kOf(numel);
    at::Tensor indices = std::get<1>(flat.abs().topk(k, 0, /*largest=*/true, /*sorted=*/false));
    at::Tensor values = flat.index_select(0, indices);
    return {at::cat({asBytes(values), asBytes(indices.to(at::kInt))}), numel};
  }

  at::Tensor decode(const EncodedTensor& encoded) const override {
    const std::int64_t numel = encoded.numel;
    const std::int64_t k = kOf(numel);
    if (encoded.bytes() != encodedBytes(numel))
      CHORUS_THROW(ProtocolError, "topk payload of ", encoded.bytes(), " bytes for ", numel,
                   " elements");
    at::Tensor bytes = encoded.payload.view({-1});
    at::Tensor values = bytes.narrow(0, 0, 4 * k).clone().view(at::kFloat);
    at::Tensor indices = bytes.narrow(0, 4 * k, 4 * k).clone().view(at::kInt).to(at::kLong);
    if (k > 0 && (indices.min().item<int64_t>() < 0 || indices.max().item<int64_t>() >= numel))
      CHORUS_THROW(ProtocolError, "topk payload has an index outside 0..", numel - 1);
    return at::zeros({numel}, at::kFloat).index_copy_(0, indices, values);
  }

  std::int64_t encodedBytes(std::int64_t numel) const override { return 8 * kOf(numel); }

 private:
  std::int64_t kOf(std::int64_t numel) const {
    if (numel == 0) return 0;
    const auto k = static_cast<std::int64_t>(std::ceil(ratio_ * static_cast<double>(numel)));
    return std::min(numel, std::max<std::int64_t>(1, k));
  }

  double ratio_;
};

}  // namespace

std::unique_ptr<ElementCodec> makeTopKCodec(double ratio) {
  if (!(ratio > 0 && ratio <= 1))
    CHORUS_THROW(ConfigError, "topk codec: ratio must be in (0, 1], got ", ratio);
  return std::make_unique<TopKCodec>(ratio);
}

namespace {

class GatherCodec : public GradientCodec {
 public:
  explicit GatherCodec(const CodecOptions& options)
      : GradientCodec(options), element_(makeElementCodec(options)) {}

  void allReduce(const std::string& key, at::Tensor& flat, const FlatLayout&,
                 comm::Communicator& comm) override {
    const std::int64_t numel = flat.numel();
    if (numel == 0) return;
    const bool feedback = options_.error_feedback;
    at::Tensor x = feedback ? feedback_.compensate(key, flat) : flat;
    const EncodedTensor mine = element_->encode(x);
    if (feedback) feedback_.update(key, x, element_->decode(mine));
    const std::int64_t bytes = element_->encodedBytes(numel);
    at::Tensor payload = asBytes(mine.payload);
    at::Tensor gathered = at::empty({bytes * comm.size()}, at::kByte);
    comm.allGather(payload, gathered).wait();
    at::Tensor sum = at::zeros({numel}, at::kFloat);
    for (int rank = 0; rank < comm.size(); ++rank)
      sum.add_(element_->decode({gathered.narrow(0, rank * bytes, bytes), numel}));
    flat.copy_(sum);
    countAllGather(bytes, comm.size(), static_cast<std::int64_t>(flat.nbytes()));
  }

 private:
  std::unique_ptr<ElementCodec> element_;
};

}  // namespace

std::unique_ptr<GradientCodec> makeGatherCodec(const CodecOptions& options) {
  return std::make_unique<GatherCodec>(options);
}

}  // namespace chorus::parallel::detail
