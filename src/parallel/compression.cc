// Codec names and factories, layouts, error feedback and statistics (the codecs: compression_*.cc).
#include "chorus/parallel/compression.h"

#include <ATen/ATen.h>

#include "chorus/core/error.h"
#include "compression_internal.h"

namespace chorus::parallel {
namespace {

constexpr const char* kResidualPrefix = "residual/";

bool startsWith(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

std::int64_t EncodedTensor::bytes() const {
  return payload.defined() ? static_cast<std::int64_t>(payload.nbytes()) : 0;
}

std::unique_ptr<ElementCodec> makeElementCodec(const CodecOptions& options) {
  switch (options.kind) {
    case CodecKind::kFp16:
    case CodecKind::kBf16:
      return detail::makeFloatElementCodec(options.kind);
    case CodecKind::kInt8:
      return detail::makeInt8Codec(options.int8_chunk);
    case CodecKind::kTopK:
      return detail::makeTopKCodec(options.topk_ratio);
    default:
      CHORUS_THROW(ConfigError, "codec ", toString(options.kind), " is not element-wise");
  }
}

std::unique_ptr<GradientCodec> makeCodec(const CodecOptions& options) {
  switch (options.kind) {
    case CodecKind::kNone:
      return detail::makeNoneCodec(options);
    case CodecKind::kFp16:
    case CodecKind::kBf16:
      return detail::makeFloatCodec(options);
    case CodecKind::kInt8:
    case CodecKind::kTopK:
      return detail::makeGatherCodec(options);
    case CodecKind::kPowerSgd:
      return detail::makePowerSgdCodec(options);
  }
  CHORUS_THROW(ConfigError, "unknown codec kind");
}

std::int64_t FlatLayout::Entry::numel() const {
  std::int64_t count = 1;
  for (std::int64_t dim : shape) count *= dim;
  return count;
}

FlatLayout FlatLayout::whole(const std::string& key, const at::Tensor& flat) {
  FlatLayout layout;
  layout.entries.push_back({key, 0, flat.sizes().vec()});
  return layout;
}

at::Tensor ErrorFeedback::compensate(const std::string& key, const at::Tensor& x) const {
  auto found = residuals_.find(key);
  if (found == residuals_.end() || !found->second.sizes().equals(x.sizes())) return x.clone();
  return x + found->second;
}

void ErrorFeedback::update(const std::string& key, const at::Tensor& compensated,
                           const at::Tensor& transmitted) {
  residuals_[key] = compensated - transmitted;
}

at::Tensor* ErrorFeedback::residualFor(const std::string& key, const at::Tensor& like) {
  auto found = residuals_.find(key);
  if (found == residuals_.end() || !found->second.sizes().equals(like.sizes())) return nullptr;
  return &found->second;
}

void ErrorFeedback::setResidual(const std::string& key, at::Tensor residual) {
  residuals_[key] = std::move(residual);
}

GradientCodec::Scatter GradientCodec::reduceScatter(const std::string&, const at::Tensor&,
                                                    at::Tensor, const std::vector<std::int64_t>&,
                                                    comm::Communicator&) {
  CHORUS_THROW(ConfigError, "codec ", name(),
               " cannot compress a reduce-scatter (ZeRO stage 2 and 3 take fp16 or bf16)");
}

void GradientCodec::forget(const std::string& key, const FlatLayout& layout) {
  feedback_.erase(key);
  for (const FlatLayout::Entry& entry : layout.entries) feedback_.erase(entry.key);
}

double CompressionStats::wireRatio() const {
  return wire_bytes == 0 ? 1.0
                         : static_cast<double>(raw_wire_bytes) / static_cast<double>(wire_bytes);
}

std::map<std::string, at::Tensor> GradientCodec::state() const {
  std::map<std::string, at::Tensor> state;
  for (const auto& [key, residual] : feedback_.residuals())
    state[kResidualPrefix + key] = residual.clone();
  return state;
}

void GradientCodec::loadState(const std::map<std::string, at::Tensor>& state) {
  feedback_.clear();
  for (const auto& [name, tensor] : state) {
    if (!startsWith(name, kResidualPrefix))
      CHORUS_THROW(ConfigError, "codec ", this->name(), ": unknown state entry '", name, "'");
    feedback_.setResidual(name.substr(std::string(kResidualPrefix).size()),
                          tensor.to(at::kFloat).clone());
  }
}

void GradientCodec::countAllReduce(std::int64_t payload, int ranks, std::int64_t raw) {
  const double ring = ranks > 1 ? 2.0 * (ranks - 1) / ranks : 0.0;
  if (raw > 0) ++stats_.calls;
  stats_.raw_bytes += static_cast<std::uint64_t>(raw);
  stats_.payload_bytes += static_cast<std::uint64_t>(payload);
  stats_.wire_bytes += static_cast<std::uint64_t>(ring * static_cast<double>(payload));
  stats_.raw_wire_bytes += static_cast<std::uint64_t>(ring * static_cast<double>(raw));
}

void GradientCodec::countAllGather(std::int64_t payload, int ranks, std::int64_t raw) {
  const double ring = ranks > 1 ? 2.0 * (ranks - 1) / ranks : 0.0;
  if (raw > 0) ++stats_.calls;
  stats_.raw_bytes += static_cast<std::uint64_t>(raw);
  stats_.payload_bytes += static_cast<std::uint64_t>(payload);
  stats_.wire_bytes += static_cast<std::uint64_t>(payload) * static_cast<std::uint64_t>(ranks - 1);
  stats_.raw_wire_bytes += static_cast<std::uint64_t>(ring * static_cast<double>(raw));
}

void GradientCodec::countReduceScatter(std::int64_t payload, int ranks, std::int64_t raw) {
  const double share = ranks > 1 ? static_cast<double>(ranks - 1) / ranks : 0.0;
  if (raw > 0) ++stats_.calls;
  stats_.raw_bytes += static_cast<std::uint64_t>(raw);
  stats_.payload_bytes += static_cast<std::uint64_t>(payload);
  stats_.wire_bytes += static_cast<std::uint64_t>(share * static_cast<double>(payload));
  stats_.raw_wire_bytes += static_cast<std::uint64_t>(share * static_cast<double>(raw));
}

namespace detail {

at::Tensor asBytes(const at::Tensor& tensor) {
  return tensor.contiguous().view({-1}).view(at::kByte);
}

}  // namespace detail
}  // namespace chorus::parallel
