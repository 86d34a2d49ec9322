// Dynamic loss scaling, gradient unscaling and autocast scopes.
#include "chorus/parallel/loss_scaler.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>

#include "chorus/core/error.h"
#include "chorus/parallel/precision.h"

namespace chorus::parallel {
namespace {

TEST(DynamicLossScaler, BacksOffOnOverflowAndGrowsAfterTheInterval) {
  LossScalerOptions options;
  options.init_scale = 1024;
  options.growth_interval = 3;
  DynamicLossScaler scaler(options);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 512);
  scaler.update(false);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 512);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 1024);
  scaler.update(false);
  scaler.update(true);  // an overflow restarts the count of clean steps
  scaler.update(false);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 512);
  DynamicLossScaler copy(options);
  copy.loadState(scaler.state());
  EXPECT_EQ(copy.scale(), 512);
  EXPECT_EQ(copy.state().clean_steps, 2);
}

TEST(DynamicLossScaler, DefaultsAreGradScalers) {
  DynamicLossScaler scaler;
  EXPECT_EQ(scaler.scale(), 65536.0);
  EXPECT_EQ(scaler.options().growth_factor, 2.0);
  EXPECT_EQ(scaler.options().backoff_factor, 0.5);
  EXPECT_EQ(scaler.options().growth_interval, 2000);
  LossScalerOptions bad;
  bad.backoff_factor = 1.5;
  EXPECT_THROW(DynamicLossScaler{bad}, ConfigError);
}

TEST(GradientUnscaler, DividesGradientsByTheScaleAndSeesOverflow) {
  at::Tensor weight = torch::ones({4}, torch::requires_grad());
  GradientUnscaler unscaler({weight});
  unscaler.beginStep(8.0);
  (weight * at::tensor({1.f, 2.f, 3.f, 4.f})).sum().mul(8.0).backward();
  EXPECT_TRUE(at::equal(weight.grad(), at::tensor({1.f, 2.f, 3.f, 4.f})));
  EXPECT_FALSE(unscaler.overflowed());
  weight.mutable_grad() = at::Tensor();
  (weight * std::numeric_limits<float>::infinity()).sum().backward();
  EXPECT_TRUE(unscaler.overflowed());
  unscaler.beginStep(8.0);
  EXPECT_FALSE(unscaler.overflowed());
}

TEST(AutocastScope, LowersMatrixProductsAndRestores) {
  const at::Tensor a = at::randn({8, 8}), b = at::randn({8, 8});
  {
    AutocastScope scope(c10::DeviceType::CPU, Precision::kBf16);
    EXPECT_EQ(at::mm(a, b).scalar_type(), at::kBFloat16);
    {
      AutocastScope inner(c10::DeviceType::CPU, Precision::kFp32);  // fp32: no change
      EXPECT_EQ(at::mm(a, b).scalar_type(), at::kBFloat16);
    }
  }
  EXPECT_EQ(at::mm(a, b).scalar_type(), at::kFloat);
  {
    // tf32 is fp32 to autocast: TF32 is a matmul mode (allowTf32), not a lower format.
    AutocastScope tf32(c10::DeviceType::CPU, Precision::kTf32);
    EXPECT_EQ(at::mm(a, b).scalar_type(), at::kFloat);
  }
  EXPECT_EQ(scalarTypeOf(Precision::kTf32), at::kFloat);
  EXPECT_EQ(scalarTypeOf(Precision::kFp16), at::kHalf);
}

}  // namespace
}  // namespace chorus::parallel
