// Private to parallel: the codec implementations behind makeCodec() and makeElementCodec().
#pragma once

#include <memory>

#include "chorus/parallel/compression.h"

namespace chorus::parallel::detail {

std::unique_ptr<ElementCodec> makeFloatElementCodec(CodecKind kind);  // kFp16 or kBf16
std::unique_ptr<ElementCodec> makeInt8Codec(std::int64_t chunk);
std::unique_ptr<ElementCodec> makeTopKCodec(double ratio);

std::unique_ptr<GradientCodec> makeNoneCodec(const CodecOptions& options);
std::unique_ptr<GradientCodec> makeFloatCodec(const CodecOptions& options);
std::unique_ptr<GradientCodec> makeGatherCodec(const CodecOptions& options);
std::unique_ptr<GradientCodec> makePowerSgdCodec(const CodecOptions& options);

// A 1-D contiguous uint8 view of the bytes of `tensor` (contiguous).
at::Tensor asBytes(const at::Tensor& tensor);

}  // namespace chorus::parallel::detail
