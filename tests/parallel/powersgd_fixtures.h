// Shared by the PowerSGD tests: seeded Gaussian tensors and the codec's options.
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstdint>
#include <vector>

#include "chorus/parallel/compression.h"

namespace chorus::parallel::testing {

// A tensor of `shape` drawn from N(0, 1) with `seed`.
inline at::Tensor gaussian(std::vector<int64_t> shape, std::uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, generator, at::kFloat);
}

// PowerSGD of rank `rank` on every tensor, however small, with error feedback when `feedback`.
inline CodecOptions powerSgd(int rank, bool feedback = false) {
  CodecOptions options;
  options.kind = CodecKind::kPowerSgd;
  options.powersgd_rank = rank;
  options.powersgd_min_elements = 0;
  options.error_feedback = feedback;
  return options;
}

}  // namespace chorus::parallel::testing
