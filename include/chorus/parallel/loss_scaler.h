// Dynamic loss scaling for fp16 ranks, and the gradient unscaling that goes with it.
//
// fp16 has too little range for small gradients: they flush to zero. A rank in fp16 multiplies its
// loss by a large scale S before backward, so its gradients are S times too large while in fp16,
// and divides them by S again as soon as each reaches its fp32 parameter — before the gradient
// reducer sees it, so ranks in different formats (or with different scales) reduce true gradients.
// When any rank's gradient overflows (inf/NaN), every rank skips that step and every fp16 rank
// backs off its scale together (overflow consensus: the trainer gathers the flags); after
// growth_interval clean steps in a row the scale grows. The defaults are PyTorch's GradScaler's.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace chorus::parallel {

struct LossScalerOptions {
  // Scale of the first step. Default: 2^16.
  double init_scale = 65536.0;
  // Factor applied after growth_interval steps without overflow. Default: 2.0.
  double growth_factor = 2.0;
  // Factor applied on an overflow. Default: 0.5.
  double backoff_factor = 0.5;
  // Clean steps in a row before the scale grows. Default: 2000.
  std::int64_t growth_interval = 2000;
};

// What a checkpoint keeps of a scaler. Value type.
struct LossScalerState {
  double scale = 65536.0;
  std::int64_t clean_steps = 0;  // steps since the last overflow or growth
};

// The scale of one rank. Value type; not thread-safe.
class DynamicLossScaler {
 public:
  // Throws ConfigError on a non-positive scale, growth <= 1, backoff outside (0, 1) or an interval
  // < 1.
  explicit DynamicLossScaler(LossScalerOptions options = {});

  double scale() const { return state_.scale; }
  // After the step's overflow consensus: backs off when `overflow`, else counts the clean step and
  // grows the scale every growth_interval of them.
  void update(bool overflow);

  LossScalerState state() const { return state_; }
  void loadState(const LossScalerState& state);
  const LossScalerOptions& options() const { return options_; }

 private:
  LossScalerOptions options_;
  LossScalerState state_;
};

// Divides every gradient flowing into `parameters` by the current scale, as it arrives (a tensor
// hook, so the gradient accumulated in .grad and seen by the reducer's hooks is unscaled), and
// records whether any arriving gradient held inf or NaN. Owns its hooks (removed on destruction).
// Used by the thread that runs backward; non-copyable.
class GradientUnscaler {
 public:
  explicit GradientUnscaler(std::vector<at::Tensor> parameters);
  ~GradientUnscaler();
  GradientUnscaler(const GradientUnscaler&) = delete;
  GradientUnscaler& operator=(const GradientUnscaler&) = delete;

  // The scale the next backward passes were multiplied by; clears the overflow record.
  void beginStep(double scale);
  // Whether any gradient since beginStep() was not finite (forces a device sync once).
  bool overflowed() const;

 private:
  std::vector<at::Tensor> parameters_;
  std::vector<unsigned> hook_ids_;
  double inverse_scale_ = 1.0;
  at::Tensor nonfinite_;  // counts non-finite gradients since beginStep, on the gradients' device
};

}  // namespace chorus::parallel
