#include "chorus/parallel/precision.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>

#include "chorus/core/error.h"

namespace chorus::parallel {

Precision parsePrecision(const std::string& name) {
  if (name == "fp32" || name == "float32") return Precision::kFp32;
  if (name == "bf16" || name == "bfloat16") return Precision::kBf16;
  if (name == "fp16" || name == "float16") return Precision::kFp16;
  CHORUS_THROW(ConfigError, "precision '", name, "' is unknown; expected fp32, bf16 or fp16");
}

const char* toString(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
  }
  return "?";
}

c10::ScalarType scalarTypeOf(Precision precision) {
  switch (precision) {
    case Precision::kBf16:
      return c10::ScalarType::BFloat16;
    case Precision::kFp16:
      return c10::ScalarType::Half;
    case Precision::kFp32:
      break;
  }
  return c10::ScalarType::Float;
}

AutocastScope::AutocastScope(c10::DeviceType device, Precision precision) : device_(device) {
  if (precision == Precision::kFp32) return;
  if (!at::autocast::is_autocast_available(device))
    CHORUS_THROW(ConfigError, "precision ", toString(precision), ": libtorch has no autocast for ",
                 c10::DeviceTypeName(device), " devices");
  was_enabled_ = at::autocast::is_autocast_enabled(device);
  previous_dtype_ = at::autocast::get_autocast_dtype(device);
  at::autocast::set_autocast_dtype(device, scalarTypeOf(precision));
  at::autocast::set_autocast_enabled(device, true);
  at::autocast::increment_nesting();
  active_ = true;
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_, was_enabled_);
  at::autocast::set_autocast_dtype(device_, previous_dtype_);
}

void allowTf32(bool matmul, bool convolution) {
  at::globalContext().setAllowTF32CuBLAS(matmul);
  at::globalContext().setAllowTF32CuDNN(convolution);
}

}  // namespace chorus::parallel
