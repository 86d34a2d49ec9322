// Error feedback: over 200 steps, the running sum of what a codec delivered must track the running
// sum of the true gradients (the error stays one step's worth, so relative to the growing sum it
// shrinks), while top-k without feedback keeps dropping the same small entries and drifts.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "chorus/parallel/compression.h"
#include "comm/rank_threads.h"

namespace chorus::parallel {
namespace {

struct Drift {
  double absolute_100 = 0, absolute_200 = 0;  // ‖Σ delivered − Σ true‖ after 100 / 200 steps
  double relative_100 = 0, relative_200 = 0;  // the same over ‖Σ true‖
};

// Gradients: a fixed direction plus 10% fresh noise per step, on one rank (the all-reduce is
// then exactly the codec's round trip).
Drift runSteps(CodecOptions options, std::vector<int64_t> shape) {
  Drift drift;
  at::set_num_threads(1);  // as a worker runs; spinning OpenMP threads crawl on a loaded host
  comm::testing::runRankThreads(1, [&](std::shared_ptr<comm::Communicator> comm) {
    auto codec = makeCodec(options);
    auto generator = at::make_generator<at::CPUGeneratorImpl>(99);
    const at::Tensor base = at::randn(shape, generator, at::kFloat).view({-1});
    at::Tensor true_sum = at::zeros_like(base), delivered_sum = at::zeros_like(base);
    const FlatLayout layout{{{"w", 0, shape}}};
    for (int step = 1; step <= 200; ++step) {
      at::Tensor gradient = base + 0.1 * at::randn(base.sizes(), generator, at::kFloat);
      true_sum += gradient;
      at::Tensor flat = gradient.clone();
      codec->allReduce("bucket0", flat, layout, *comm);
      delivered_sum += flat;
      if (step % 100 == 0) {
        const double absolute = (delivered_sum - true_sum).norm().item<double>();
        const double relative = absolute / true_sum.norm().item<double>();
        (step == 100 ? drift.absolute_100 : drift.absolute_200) = absolute;
        (step == 100 ? drift.relative_100 : drift.relative_200) = relative;
      }
    }
  });
  return drift;
}

CodecOptions codec(CodecKind kind, bool feedback) {
  CodecOptions options;
  options.kind = kind;
  options.error_feedback = feedback;
  options.topk_ratio = 0.05;
  options.powersgd_rank = 2;
  options.powersgd_min_elements = 0;
  return options;
}

TEST(ErrorFeedback, TopKTracksTheTrueSumWithFeedbackAndDriftsWithout) {
  const Drift with = runSteps(codec(CodecKind::kTopK, true), {1000});
  const Drift without = runSteps(codec(CodecKind::kTopK, false), {1000});
  // With feedback the error is bounded (what is still waiting in the residual), so relative to
  // the sum, which grows linearly, it shrinks.
  EXPECT_LT(with.relative_200, 0.15);
  EXPECT_LT(with.relative_200, with.relative_100);
  EXPECT_LT(with.absolute_200, 1.5 * with.absolute_100);
  // Without, the same entries are dropped every step: the error grows with the sum.
  EXPECT_GT(without.relative_200, 0.5);
  EXPECT_GT(without.absolute_200, 1.8 * without.absolute_100);
  EXPECT_LT(with.relative_200 * 5, without.relative_200);
}

TEST(ErrorFeedback, Int8AndPowerSgdStaySmallAndDoNotGrow) {
  for (auto kind : {CodecKind::kInt8, CodecKind::kPowerSgd}) {
    const Drift drift = runSteps(codec(kind, true), {50, 40});
    EXPECT_LT(drift.relative_200, kind == CodecKind::kInt8 ? 1e-4 : 0.15) << toString(kind);
    EXPECT_LT(drift.absolute_200, 1.5 * drift.absolute_100) << toString(kind);
  }
}

}  // namespace
}  // namespace chorus::parallel
