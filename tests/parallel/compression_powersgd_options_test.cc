// PowerSGD's options: more power iterations approach the best rank-r error for their bytes, bf16
// factors halve the factor bytes within bf16's rounding, the first start_step calls are plain fp32
// all-reduces (and survive a checkpoint), min_compression_rate decides what is compressed, and
// bad values are ConfigErrors.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "chorus/core/error.h"
#include "chorus/parallel/compression.h"
#include "comm/rank_threads.h"
#include "parallel/powersgd_fixtures.h"

namespace chorus::parallel {
namespace {

using testing::gaussian;
using testing::powerSgd;

// A 80×60 matrix with singular values 10, 6, 3, 2, 1, 0.5 (orthonormal u, v).
struct Spectrum {
  at::Tensor matrix;
  double best_rank_two_error = 0;
};

Spectrum spectrum() {
  const at::Tensor u = std::get<0>(at::linalg_qr(gaussian({80, 6}, 3)));
  const at::Tensor v = std::get<0>(at::linalg_qr(gaussian({60, 6}, 4)));
  const at::Tensor sigma = at::tensor({10.0f, 6.0f, 3.0f, 2.0f, 1.0f, 0.5f});
  return {u.matmul(at::diag(sigma)).matmul(v.t()),
          sigma.narrow(0, 2, 4).pow(2).sum().sqrt().item<double>()};
}

// Error of the first call (cold start) and the bytes it sent.
std::pair<double, std::uint64_t> firstCall(const CodecOptions& options, const at::Tensor& matrix) {
  std::pair<double, std::uint64_t> result;
  comm::testing::runRankThreads(1, [&](std::shared_ptr<comm::Communicator> comm) {
    auto codec = makeCodec(options);
    at::Tensor flat = matrix.reshape({-1}).clone();
    codec->allReduce("b", flat, FlatLayout{{{"w", 0, {80, 60}}}}, *comm);
    result = {(flat.view({80, 60}) - matrix).norm().item<double>(), codec->stats().payload_bytes};
  });
  return result;
}

TEST(PowerSgdOptions, MoreIterationsComeCloserToTheBestRankRError) {
  const Spectrum s = spectrum();
  CodecOptions options = powerSgd(2);
  const auto [one_error, one_bytes] = firstCall(options, s.matrix);
  options.powersgd_iterations = 3;
  const auto [three_error, three_bytes] = firstCall(options, s.matrix);
  EXPECT_EQ(one_bytes, 4u * 2 * (80 + 60));
  EXPECT_EQ(three_bytes, 3 * one_bytes);
  EXPECT_LT(three_error, one_error);
  EXPECT_LE(three_error, s.best_rank_two_error * 1.05) << "one iteration: " << one_error;
}

// bf16 factors: half the bytes of P and Q, the 1-D tensor still exact in fp32, a rank-4 sum over
// two ranks exact to bf16's rounding (8 significant bits per factor and per sum).
TEST(PowerSgdOptions, Bf16FactorsHalveTheFactorBytes) {
  const at::Tensor matrix = gaussian({64, 4}, 1).matmul(gaussian({4, 48}, 2));
  const at::Tensor bias = at::arange(48).to(at::kFloat);
  const FlatLayout layout{{{"w", 0, {64, 48}}, {"bias", 64 * 48, {48}}}};
  CodecOptions options = powerSgd(4);
  options.powersgd_bf16_factors = true;
  comm::testing::runRankThreads(2, [&](std::shared_ptr<comm::Communicator> comm) {
    auto codec = makeCodec(options);
    at::Tensor flat = at::cat({matrix.view({-1}), bias}) * (comm->rank() + 1);
    codec->allReduce("b", flat, layout, *comm);
    EXPECT_EQ(codec->stats().payload_bytes, 2u * (64 * 4 + 48 * 4) + 4u * 48);
    EXPECT_TRUE(at::equal(flat.narrow(0, 64 * 48, 48), bias * 3));
    const at::Tensor error = flat.narrow(0, 0, 64 * 48).view({64, 48}) - matrix * 3;
    EXPECT_LE(error.norm().item<double>(), 0.02 * (matrix * 3).norm().item<double>());
  });
}

// The first start_step calls are exact fp32 sums at full size; the count is part of the state.
TEST(PowerSgdOptions, StartStepSendsPlainSumsFirstAndIsCheckpointed) {
  CodecOptions options = powerSgd(2);
  options.powersgd_start_step = 2;
  const FlatLayout layout{{{"w", 0, {80, 60}}}};
  const std::uint64_t full = 4u * 80 * 60, compressed = 4u * 2 * (80 + 60);
  comm::testing::runRankThreads(2, [&](std::shared_ptr<comm::Communicator> comm) {
    auto codec = makeCodec(options);
    const at::Tensor mine = gaussian({80 * 60}, 20 + comm->rank());
    const at::Tensor sum = gaussian({80 * 60}, 20) + gaussian({80 * 60}, 21);
    for (int call = 0; call < 2; ++call) {
      at::Tensor flat = mine.clone();
      codec->allReduce("b", flat, layout, *comm);
      EXPECT_TRUE(at::allclose(flat, sum, 0, 1e-6)) << "call " << call;
      EXPECT_EQ(codec->stats().payload_bytes, (call + 1) * full);
    }
    const auto state = codec->state();
    ASSERT_EQ(state.count("calls/b"), 1u);
    auto restored = makeCodec(options);
    restored->loadState(state);
    at::Tensor flat = mine.clone();
    restored->allReduce("b", flat, layout, *comm);
    EXPECT_EQ(restored->stats().payload_bytes, compressed);
    EXPECT_FALSE(at::allclose(flat, sum, 0, 1e-3)) << "rank 2 of a random matrix is not exact";
  });
}

// 64×48 at rank 4 sends 448 numbers instead of 3072: a rate of 6.9.
TEST(PowerSgdOptions, MinCompressionRateDecidesWhatIsCompressed) {
  CodecOptions options = powerSgd(4);
  for (double rate : {2.0, 8.0}) {
    options.powersgd_min_compression_rate = rate;
    comm::testing::runRankThreads(2, [&](std::shared_ptr<comm::Communicator> comm) {
      auto codec = makeCodec(options);
      at::Tensor flat = gaussian({64 * 48}, 30 + comm->rank());
      codec->allReduce("b", flat, FlatLayout{{{"w", 0, {64, 48}}}}, *comm);
      EXPECT_EQ(codec->stats().payload_bytes, rate < 6.9 ? 4u * 4 * (64 + 48) : 4u * 64 * 48);
    });
  }
}

TEST(PowerSgdOptions, BadValuesAreConfigErrors) {
  CodecOptions options = powerSgd(4);
  options.powersgd_iterations = 0;
  EXPECT_THROW(makeCodec(options), ConfigError);
  options = powerSgd(4);
  options.powersgd_min_compression_rate = 0.5;
  EXPECT_THROW(makeCodec(options), ConfigError);
  options = powerSgd(4);
  options.powersgd_start_step = -1;
  EXPECT_THROW(makeCodec(options), ConfigError);
}

}  // namespace
}  // namespace chorus::parallel
