// PowerSGD: exact on matrices of rank <= r (also rank-deficient ones), warm start converges toward
// the best rank-r error, small tensors travel exactly, and its state restores the warm start bit
// for bit. The options (iterations, bf16 factors, start step, ...): compression_powersgd_options.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <mutex>

#include "chorus/parallel/compression.h"
#include "comm/rank_threads.h"
#include "parallel/powersgd_fixtures.h"

namespace chorus::parallel {
namespace {

using testing::gaussian;
using testing::powerSgd;

// A 64x48 matrix of rank exactly 4 and a bias: rank r contributes (r + 1) times both, so the sum
// (6x) still has rank 4 and must come back exact, the bias through the uncompressed path.
TEST(PowerSgd, ReconstructsAnExactlyRankRSumOverRanks) {
  const at::Tensor matrix = gaussian({64, 4}, 1).matmul(gaussian({4, 48}, 2));
  const at::Tensor bias = at::arange(48).to(at::kFloat);
  FlatLayout layout;
  layout.entries.push_back({"weight", 0, {64, 48}});
  layout.entries.push_back({"bias", 64 * 48, {48}});
  std::mutex mutex;
  std::vector<at::Tensor> results(3);
  comm::testing::runRankThreads(3, [&](std::shared_ptr<comm::Communicator> comm) {
    auto codec = makeCodec(powerSgd(4));
    at::Tensor flat = at::cat({matrix.view({-1}), bias}) * (comm->rank() + 1);
    codec->allReduce("bucket0", flat, layout, *comm);
    std::lock_guard<std::mutex> lock(mutex);
    results[comm->rank()] = flat;
    // Two all-reduces: P (64x4) plus the bias, then Q (48x4).
    EXPECT_EQ(codec->stats().payload_bytes, 4u * (64 * 4 + 48 + 48 * 4));
  });
  EXPECT_TRUE(at::equal(results[1], results[0]));
  EXPECT_TRUE(at::equal(results[2], results[0]));
  at::Tensor weight = results[0].narrow(0, 0, 64 * 48).view({64, 48});
  const double largest = (matrix * 6).abs().max().item<double>();
  EXPECT_LE((weight - matrix * 6).abs().max().item<double>(), 1e-5 * largest);
  EXPECT_TRUE(at::equal(results[0].narrow(0, 64 * 48, 48), bias * 6));
}

// Largest |result − expected| over largest |expected|.
double relativeError(const at::Tensor& result, const at::Tensor& expected) {
  return ((result - expected).abs().max() / expected.abs().max()).item<double>();
}

// Rank-deficient inputs (rank 1 and 2 at r = 4, as the multi-host benchmark's u vᵀ): P has
// dependent columns, which must not turn into amplified rounding noise. Rank k contributes
// (k + 1)·M; three calls check that the warm start stays exact too.
TEST(PowerSgd, RankDeficientMatricesRoundTripExactly) {
  const at::Tensor u = at::linspace(1.0, 2.0, 256, at::kFloat);
  const at::Tensor v = at::linspace(-1.0, 1.0, 256, at::kFloat);
  const at::Tensor rank_one = at::outer(u, v);
  const at::Tensor rank_two = rank_one + at::outer(gaussian({256}, 11), gaussian({256}, 12));
  for (const at::Tensor& matrix : {rank_one, rank_two}) {
    for (bool feedback : {false, true}) {
      comm::testing::runRankThreads(3, [&](std::shared_ptr<comm::Communicator> comm) {
        auto codec = makeCodec(powerSgd(4, feedback));
        const FlatLayout layout{{{"w", 0, {256, 256}}}};
        for (int call = 0; call < 3; ++call) {
          at::Tensor flat = (matrix * (comm->rank() + 1)).reshape({-1}).contiguous();
          codec->allReduce("b", flat, layout, *comm);
          EXPECT_LE(relativeError(flat.view({256, 256}), matrix * 6), 1e-5)
              << "call " << call << " feedback " << feedback;
        }
      });
    }
  }
}

// A rank-1 call zeroes P's dependent columns; their warm-start Q must not stay zero (P = M·0 would
// never find those directions again), so a later rank-3 matrix comes back exact at once.
TEST(PowerSgd, DirectionsDroppedOnARankOneCallAreFoundLater) {
  const at::Tensor rank_one = at::outer(gaussian({96}, 13), gaussian({80}, 14));
  const at::Tensor rank_three = gaussian({96, 3}, 15).matmul(gaussian({3, 80}, 16));
  comm::testing::runRankThreads(2, [&](std::shared_ptr<comm::Communicator> comm) {
    auto codec = makeCodec(powerSgd(4));
    const FlatLayout layout{{{"w", 0, {96, 80}}}};
    at::Tensor flat = rank_one.reshape({-1}).clone();
    codec->allReduce("b", flat, layout, *comm);
    EXPECT_LE(relativeError(flat.view({96, 80}), rank_one * 2), 1e-5);
    flat = rank_three.reshape({-1}).clone();
    codec->allReduce("b", flat, layout, *comm);
    EXPECT_LE(relativeError(flat.view({96, 80}), rank_three * 2), 1e-5);
  });
}

// Repeated compression of one matrix (no error feedback) is a power iteration: the error falls
// toward the best rank-2 error, sqrt(sum of the squared singular values beyond the second).
TEST(PowerSgd, WarmStartImprovesTheApproximation) {
  const at::Tensor u = std::get<0>(at::linalg_qr(gaussian({80, 8}, 3)));
  const at::Tensor v = std::get<0>(at::linalg_qr(gaussian({60, 8}, 4)));
  const at::Tensor sigma = at::tensor({10.0f, 6.0f, 3.0f, 2.0f, 1.0f, 0.5f, 0.25f, 0.1f});
  const at::Tensor matrix = u.matmul(at::diag(sigma)).matmul(v.t());
  const double best = sigma.narrow(0, 2, 6).pow(2).sum().sqrt().item<double>();
  comm::testing::runRankThreads(1, [&](std::shared_ptr<comm::Communicator> comm) {
    auto codec = makeCodec(powerSgd(2));
    std::vector<double> errors;
    for (int step = 0; step < 10; ++step) {
      at::Tensor flat = matrix.reshape({-1}).clone();
      codec->allReduce("w", flat, FlatLayout{{{"w", 0, {80, 60}}}}, *comm);
      errors.push_back((flat.view({80, 60}) - matrix).norm().item<double>());
    }
    EXPECT_LT(errors.back(), errors.front());
    EXPECT_LE(errors.back(), best * 1.01) << "first " << errors.front() << " best " << best;
    EXPECT_GE(errors.back(), best * (1 - 1e-4));  // no rank-2 matrix beats the SVD
  });
}

TEST(PowerSgd, SmallAndOneDimensionalTensorsTravelUncompressed) {
  CodecOptions options = powerSgd(4);
  options.powersgd_min_elements = 1000;
  comm::testing::runRankThreads(2, [&](std::shared_ptr<comm::Communicator> comm) {
    auto codec = makeCodec(options);
    at::Tensor flat = gaussian({30 * 20 + 500}, 5 + comm->rank());
    at::Tensor expected = gaussian({30 * 20 + 500}, 5) + gaussian({30 * 20 + 500}, 6);
    FlatLayout layout{{{"small", 0, {30, 20}}, {"vector", 600, {500}}}};
    codec->allReduce("b", flat, layout, *comm);
    EXPECT_TRUE(at::allclose(flat, expected, 0, 1e-6));
    EXPECT_TRUE(codec->state().empty());
  });
}

// A codec restored from a checkpoint continues exactly as the original would have.
TEST(PowerSgd, StateRestoresWarmStartAndResiduals) {
  const FlatLayout layout{{{"w", 0, {40, 30}}}};
  comm::testing::runRankThreads(1, [&](std::shared_ptr<comm::Communicator> comm) {
    auto original = makeCodec(powerSgd(3, true));
    auto first = gaussian({1200}, 7), second = gaussian({1200}, 8);
    at::Tensor a = first.clone();
    original->allReduce("b", a, layout, *comm);
    const auto state = original->state();
    ASSERT_EQ(state.count("q/w"), 1u);
    ASSERT_EQ(state.count("residual/w"), 1u);
    at::Tensor b = second.clone();
    original->allReduce("b", b, layout, *comm);
    auto restored = makeCodec(powerSgd(3, true));
    restored->loadState(state);
    at::Tensor c = second.clone();
    restored->allReduce("b", c, layout, *comm);
    EXPECT_TRUE(at::equal(b, c));
  });
}

// A 256x256 gradient at rank 4 sends 4 (256 + 256) numbers instead of 65536.
TEST(PowerSgd, SendsAtLeastTenTimesFewerBytes) {
  comm::testing::runRankThreads(2, [&](std::shared_ptr<comm::Communicator> comm) {
    auto codec = makeCodec(powerSgd(4));
    at::Tensor flat = gaussian({256 * 256}, 9 + comm->rank());
    codec->allReduce("b", flat, FlatLayout{{{"w", 0, {256, 256}}}}, *comm);
    EXPECT_EQ(codec->stats().payload_bytes, 4u * 4 * 512);
    EXPECT_GE(codec->stats().wireRatio(), 10.0);
  });
}

}  // namespace
}  // namespace chorus::parallel
