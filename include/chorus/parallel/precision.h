// Per-device compute precision: which number format a rank's forward and backward run in.
//
// Unlike devices are fast in unlike formats (A100: TF32/BF16/FP16; V100: FP16 only; CPUs:
// FP32/BF16), so each rank picks its own. Whatever the format, parameters and the optimizer stay
// fp32 ("master weights") and gradients reach the reducer in fp32: autocast only lowers the
// precision of the operations that are safe to lower (matrix products, convolutions) inside the
// forward pass, and autograd returns fp32 gradients for fp32 leaves. So ranks in different formats
// still reduce the same kind of gradient and the replicas never drift apart in their weights.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include "chorus/plan/device_catalog.h"

namespace chorus::parallel {

// A rank's compute format is the plan's number format (one vocabulary; plan::toString and
// plan::parseDtype name it): kFp32, kBf16 and kFp16 as autocast runs them; kTf32 is fp32 as far as
// autocast goes (TF32 is a matmul mode, allowTf32).
using Precision = plan::Dtype;

// The scalar type autocast lowers to (kFloat for fp32 and tf32).
c10::ScalarType scalarTypeOf(Precision precision);
// Whether fp16 gradients need dynamic loss scaling (only fp16 has too little range).
inline bool needsLossScaling(Precision precision) { return precision == Precision::kFp16; }

// Enables autocast to `precision` on `device` for its lifetime (a no-op for fp32), restoring the
// previous autocast state afterwards and dropping autocast's cast cache when the outermost scope
// ends (the cache holds lowered copies of the weights, stale after the optimizer step). Scopes
// nest. Thread-local like autocast itself; non-copyable. Throws ConfigError when libtorch has no
// autocast for that device and format.
class AutocastScope {
 public:
  AutocastScope(c10::DeviceType device, Precision precision);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  c10::DeviceType device_;
  bool active_ = false;
  bool was_enabled_ = false;
  c10::ScalarType previous_dtype_ = c10::ScalarType::Float;
};

// Allows TF32 tensor cores on CUDA for fp32 matrix products (cuBLAS; PyTorch's
// torch.backends.cuda.matmul.allow_tf32, off by default) and, separately, for fp32 convolutions
// (cuDNN; torch.backends.cudnn.allow_tf32, which PyTorch leaves on by default). Process-wide;
// call once at worker start-up. Harmless without CUDA.
void allowTf32(bool matmul, bool convolution);

}  // namespace chorus::parallel
