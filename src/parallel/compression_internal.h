// Private to parallel: the codec implementations behind makeCodec() and makeElementCodec().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chorus/parallel/compression.h"

namespace chorus::parallel::detail {

std::unique_ptr<ElementCodec> makeFloatElementCodec(CodecKind kind);  // kFp16 or kBf16
std::unique_ptr<ElementCodec> makeInt8Codec(std::int64_t chunk);
std::unique_ptr<ElementCodec> makeTopKCodec(double ratio);

std::unique_ptr<GradientCodec> makeNoneCodec(const CodecOptions& options);
std::unique_ptr<GradientCodec> makeFloatCodec(const CodecOptions& options);
std::unique_ptr<GradientCodec> makeGatherCodec(const CodecOptions& options);
std::unique_ptr<GradientCodec> makePowerSgdCodec(const CodecOptions& options);

// PowerSGD's linear algebra (compression_powersgd_math.cc); deterministic plain loops.
//
// Orthonormalizes the columns of `p` (rows × r, contiguous fp32) in place by modified
// Gram–Schmidt in double with reorthogonalization. A column keeping no more than `dependent` of
// its norm after the projections is numerically dependent on the earlier ones: it is set to zero
// (kept[j] false) rather than normalized, which would amplify rounding noise into a direction.
std::vector<bool> orthonormalizeColumns(at::Tensor& p, double dependent);
// rows × cols standard normal fp32, from `seed` xor an FNV-1a hash of `key` (equal on all ranks).
at::Tensor seededColumns(std::uint64_t seed, const std::string& key, std::int64_t rows,
                         std::int64_t cols);
// Replaces each column j of `q` with !kept[j] by a seeded normal column: a zero warm start would
// stay zero forever (P = M·0), so that direction could never be found again.
void reseedColumns(at::Tensor& q, const std::vector<bool>& kept, std::uint64_t seed,
                   const std::string& key);

// A 1-D contiguous uint8 view of the bytes of `tensor` (contiguous).
at::Tensor asBytes(const at::Tensor& tensor);

}  // namespace chorus::parallel::detail
