#include "chorus/parallel/precision.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>

#include "chorus/core/error.h"

namespace chorus::parallel {
c10::ScalarType scalarTypeOf(Precision precision) {
  switch (precision) {
    case Precision::kBf16:
      return c10::ScalarType::BFloat16;
    case Precision::kFp16:
      return c10::ScalarType::Half;
    case Precision::kFp32:
    case Precision::kTf32:
      break;
  }
  return c10::ScalarType::Float;
}

AutocastScope::AutocastScope(c10::DeviceType device, Precision precision) : device_(device) {
  if (scalarTypeOf(precision) == c10::ScalarType::Float) return;
  if (!at::autocast::is_autocast_available(device))
    CHORUS_THROW(ConfigError, "precision ", plan::toString(precision),
                 ": libtorch has no autocast for ", c10::DeviceTypeName(device), " devices");
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
