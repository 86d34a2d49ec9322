// Codec round trips against their documented bounds, and the compressed all-reduce over ranks as
// threads: the expected sums are built from the same element codecs, so they are known exactly.
#include "chorus/parallel/compression.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>

#include "chorus/core/error.h"
#include "comm/rank_threads.h"

namespace chorus::parallel {
namespace {

at::Tensor gaussian(std::int64_t numel, std::uint64_t seed, double scale = 1.0) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn({numel}, generator, at::kFloat) * scale;
}

CodecOptions optionsFor(CodecKind kind) {
  CodecOptions options;
  options.kind = kind;
  return options;
}

TEST(Compression, Fp16AndBf16RoundingIsWithinTheirRelativeBound) {
  // |x| in [2^-10, 2^14): inside fp16's normal range, where the relative bound holds.
  const at::Tensor mantissa =
      gaussian(5001, 1).sign() * (1 + gaussian(5001, 2).abs().clamp_max(0.99));
  at::Tensor x = mantissa * at::pow(2.0, at::arange(5001) % 24 - 10).to(at::kFloat);
  for (auto [kind, bound] : {std::pair{CodecKind::kFp16, std::ldexp(1.0, -11)},
                             std::pair{CodecKind::kBf16, std::ldexp(1.0, -8)}}) {
    auto codec = makeElementCodec(optionsFor(kind));
    const EncodedTensor encoded = codec->encode(x);
    EXPECT_EQ(encoded.bytes(), 2 * 5001);
    EXPECT_EQ(codec->encodedBytes(5001), 2 * 5001);
    at::Tensor error = (codec->decode(encoded) - x).abs();
    EXPECT_TRUE(at::all(error <= x.abs() * bound).item<bool>()) << codec->name();
    EXPECT_GT(error.max().item<double>(), 0.0) << codec->name() << " is not lossy?";
  }
}

TEST(Compression, Fp16SaturatesInsteadOfOverflowing) {
  auto codec = makeElementCodec(optionsFor(CodecKind::kFp16));
  at::Tensor x = at::tensor({1e6f, -1e6f, 3.0f});
  at::Tensor back = codec->decode(codec->encode(x));
  EXPECT_TRUE(at::equal(back, at::tensor({65504.0f, -65504.0f, 3.0f})));
}

TEST(Compression, Int8ErrorIsAtMostHalfAScalePerChunk) {
  CodecOptions options = optionsFor(CodecKind::kInt8);
  options.int8_chunk = 64;
  auto codec = makeElementCodec(options);
  const std::int64_t numel = 1000;  // 15 full chunks and a partial one
  at::Tensor x = gaussian(numel, 2) * (at::arange(numel) / 64 + 1).to(at::kFloat);
  x.narrow(0, 128, 64).zero_();  // an all-zero chunk must decode to zeros
  const EncodedTensor encoded = codec->encode(x);
  EXPECT_EQ(encoded.bytes(), numel + 4 * 16);
  at::Tensor back = codec->decode(encoded);
  for (std::int64_t chunk = 0; chunk < 16; ++chunk) {
    const std::int64_t length = std::min<std::int64_t>(64, numel - chunk * 64);
    at::Tensor part = x.narrow(0, chunk * 64, length);
    const double scale = part.abs().max().item<double>() / 127.0;
    const double worst = (back.narrow(0, chunk * 64, length) - part).abs().max().item<double>();
    EXPECT_LE(worst, scale / 2 * (1 + 1e-5)) << "chunk " << chunk;
  }
  EXPECT_TRUE(at::equal(back.narrow(0, 128, 64), at::zeros({64})));
}

TEST(Compression, TopKKeepsTheLargestExactlyAndDropsTheRest) {
  CodecOptions options = optionsFor(CodecKind::kTopK);
  options.topk_ratio = 0.1;
  auto codec = makeElementCodec(options);
  at::Tensor x = gaussian(1000, 3);
  const EncodedTensor encoded = codec->encode(x);
  EXPECT_EQ(encoded.bytes(), 8 * 100);
  at::Tensor back = codec->decode(encoded);
  at::Tensor kept = back != 0;
  EXPECT_EQ(kept.sum().item<int64_t>(), 100);
  EXPECT_TRUE(at::equal(back.masked_select(kept), x.masked_select(kept)));
  const double smallest_kept = x.masked_select(kept).abs().min().item<double>();
  EXPECT_LE(x.masked_select(~kept).abs().max().item<double>(), smallest_kept);
  const double dropped = (x - back).pow(2).sum().item<double>();
  EXPECT_LE(dropped, (1 - 0.1) * x.pow(2).sum().item<double>());
  EXPECT_EQ(codec->encodedBytes(0), 0);
  EXPECT_EQ(codec->encodedBytes(5), 8);  // at least one element
}

TEST(Compression, CorruptPayloadsAndBadOptionsAreTypedErrors) {
  auto topk = makeElementCodec(optionsFor(CodecKind::kTopK));
  EncodedTensor encoded = topk->encode(gaussian(300, 4));
  encoded.payload.narrow(0, encoded.bytes() - 4, 4).fill_(255);  // index -1
  EXPECT_THROW(topk->decode(encoded), ProtocolError);
  auto int8 = makeElementCodec(optionsFor(CodecKind::kInt8));
  EXPECT_THROW(int8->decode({at::zeros({3}, at::kByte), 300}), ProtocolError);
  CodecOptions bad = optionsFor(CodecKind::kTopK);
  bad.topk_ratio = 0;
  EXPECT_THROW(makeElementCodec(bad), ConfigError);
  EXPECT_THROW(makeElementCodec(optionsFor(CodecKind::kPowerSgd)), ConfigError);
  EXPECT_THROW(parseCodecKind("zip"), ConfigError);
  EXPECT_EQ(parseCodecKind("powersgd"), CodecKind::kPowerSgd);
}

// Each rank contributes its own Gaussian vector; the result must be the same bits on every rank
// and, for the gathering codecs, exactly the rank-ordered sum of the decoded contributions.
void checkAllReduce(CodecKind kind) {
  const int ranks = 3;
  const std::int64_t numel = 4097;
  std::vector<at::Tensor> inputs;
  for (int rank = 0; rank < ranks; ++rank) inputs.push_back(gaussian(numel, 10 + rank));
  std::mutex mutex;
  std::vector<at::Tensor> results(ranks);
  std::vector<CompressionStats> stats(ranks);
  comm::testing::runRankThreads(ranks, [&](std::shared_ptr<comm::Communicator> comm) {
    auto codec = makeCodec(optionsFor(kind));
    at::Tensor flat = inputs[comm->rank()].clone();
    codec->allReduce("bucket0", flat, FlatLayout::whole("bucket0", flat), *comm);
    std::lock_guard<std::mutex> lock(mutex);
    results[comm->rank()] = flat;
    stats[comm->rank()] = codec->stats();
  });
  for (int rank = 1; rank < ranks; ++rank)
    EXPECT_TRUE(at::equal(results[rank], results[0])) << toString(kind) << " rank " << rank;
  at::Tensor exact = inputs[0] + inputs[1] + inputs[2];
  at::Tensor absolute = inputs[0].abs() + inputs[1].abs() + inputs[2].abs();
  if (kind == CodecKind::kInt8 || kind == CodecKind::kTopK) {
    auto element = makeElementCodec(optionsFor(kind));
    at::Tensor expected = at::zeros({numel});
    for (const auto& input : inputs) expected.add_(element->decode(element->encode(input)));
    EXPECT_TRUE(at::equal(results[0], expected)) << toString(kind);
    const std::int64_t payload = element->encodedBytes(numel);
    EXPECT_EQ(stats[0].payload_bytes, static_cast<std::uint64_t>(payload));
    EXPECT_EQ(stats[0].wire_bytes, static_cast<std::uint64_t>(2 * payload));
  } else if (kind == CodecKind::kNone) {
    EXPECT_TRUE(at::allclose(results[0], exact, 1e-6, 1e-6));
    EXPECT_DOUBLE_EQ(stats[0].wireRatio(), 1.0);
  } else {
    const double unit = kind == CodecKind::kFp16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
    at::Tensor error = (results[0] - exact).abs();
    EXPECT_TRUE(at::all(error <= absolute * (ranks * unit) + 1e-7).item<bool>()) << toString(kind);
    EXPECT_EQ(stats[0].payload_bytes, static_cast<std::uint64_t>(2 * numel));
  }
  EXPECT_EQ(stats[0].raw_bytes, static_cast<std::uint64_t>(4 * numel));
  EXPECT_EQ(stats[0].calls, 1u);
}

TEST(Compression, AllReduceNone) { checkAllReduce(CodecKind::kNone); }
TEST(Compression, AllReduceFp16) { checkAllReduce(CodecKind::kFp16); }
TEST(Compression, AllReduceBf16) { checkAllReduce(CodecKind::kBf16); }
TEST(Compression, AllReduceInt8) { checkAllReduce(CodecKind::kInt8); }
TEST(Compression, AllReduceTopK) { checkAllReduce(CodecKind::kTopK); }

// Top-k at 1% over 3 ranks sends (n−1)·8k bytes against 2(n−1)/n·4N for fp32: ≥ 10× fewer.
TEST(Compression, TopKSendsAtLeastTenTimesFewerBytes) {
  comm::testing::runRankThreads(3, [](std::shared_ptr<comm::Communicator> comm) {
    auto codec = makeCodec(optionsFor(CodecKind::kTopK));
    at::Tensor flat = gaussian(100000, 20 + comm->rank());
    codec->allReduce("b", flat, FlatLayout::whole("b", flat), *comm);
    EXPECT_GE(codec->stats().wireRatio(), 10.0);
    EXPECT_EQ(comm->stats().at("all_gather").bytes, codec->stats().payload_bytes);
  });
}

TEST(Compression, StateRoundTripsResiduals) {
  comm::testing::runRankThreads(1, [](std::shared_ptr<comm::Communicator> comm) {
    auto codec = makeCodec(optionsFor(CodecKind::kInt8));
    at::Tensor flat = gaussian(1000, 30);
    codec->allReduce("bucket3", flat, FlatLayout::whole("bucket3", flat), *comm);
    const auto state = codec->state();
    ASSERT_EQ(state.count("residual/bucket3"), 1u);
    EXPECT_GT(state.at("residual/bucket3").abs().max().item<double>(), 0.0);
    auto restored = makeCodec(optionsFor(CodecKind::kInt8));
    restored->loadState(state);
    EXPECT_TRUE(at::equal(restored->state().at("residual/bucket3"), state.at("residual/bucket3")));
    EXPECT_THROW(restored->loadState({{"bogus/x", at::zeros({1})}}), ConfigError);
  });
}

}  // namespace
}  // namespace chorus::parallel
