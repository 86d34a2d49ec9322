#include "bench_comm_allreduce.h"

#include <ATen/ATen.h>

#include <cmath>
#include <functional>
#include <vector>

#include "chorus/core/clock.h"
#include "chorus/core/error.h"
#include "chorus/parallel/compression.h"

namespace chorus::cli {
namespace {

using parallel::CodecKind;

constexpr const char* kKey = "buffer";

// The buffer as a near-square [rows, cols] matrix, so PowerSGD compresses it as one matrix.
std::vector<std::int64_t> matrixShape(std::int64_t count) {
  auto rows = static_cast<std::int64_t>(std::sqrt(static_cast<double>(count)));
  while (rows > 1 && count % rows != 0) --rows;
  return {std::max<std::int64_t>(rows, 1), count / std::max<std::int64_t>(rows, 1)};
}

// Rank r's input of `count` float32 elements. PowerSGD is only exact on matrices of rank <= r, so
// it gets (r + 1)·u vᵀ (u, v small integers: rank 1, every sum exact); the others the pattern.
at::Tensor inputOf(int rank, std::int64_t count, CodecKind codec) {
  if (codec != CodecKind::kPowerSgd) return benchPattern(rank, 0, count, at::kFloat);
  const auto shape = matrixShape(count);
  const at::Tensor u = at::remainder(at::arange(shape[0], at::kDouble), 5) + 1;
  const at::Tensor v = at::remainder(at::arange(shape[1], at::kDouble), 7) - 3;
  return (at::outer(u, v) * (rank + 1)).reshape({-1}).to(at::kFloat);
}

// What each codec participant feeds in (double): every rank its own input for the flat form, the
// sum of its group for the leaders of the hierarchical form.
std::vector<at::Tensor> contributions(const comm::Topology& topology, bool flat, std::int64_t count,
                                      CodecKind codec) {
  std::vector<at::Tensor> parts;
  for (int group = 0; group < topology.numGroups(); ++group) {
    if (flat) {
      for (int rank : topology.group(group))
        parts.push_back(inputOf(rank, count, codec).to(at::kDouble));
      continue;
    }
    at::Tensor sum = at::zeros({count}, at::kDouble);
    for (int rank : topology.group(group)) sum += inputOf(rank, count, codec).to(at::kDouble);
    parts.push_back(sum);
  }
  return parts;
}

// int8: half a scale per element's chunk, scale = max|x| / 127 over the chunk.
at::Tensor int8Bound(const at::Tensor& part, std::int64_t chunk) {
  const std::int64_t count = part.numel(), chunks = (count + chunk - 1) / chunk;
  at::Tensor padded = at::zeros({chunks * chunk}, at::kDouble);
  padded.narrow(0, 0, count).copy_(part.abs());
  at::Tensor half_scale = padded.view({chunks, chunk}).amax(1, true) / 127.0 / 2.0;
  return half_scale.expand({chunks, chunk}).reshape({-1}).narrow(0, 0, count);
}

// top-k: a dropped |x| is at most the smallest kept one, the k-th largest.
at::Tensor topKBound(const at::Tensor& part, double ratio) {
  const std::int64_t count = part.numel();
  const auto k = std::max<std::int64_t>(
      1, static_cast<std::int64_t>(std::ceil(ratio * static_cast<double>(count))));
  return std::get<0>(at::topk(part.abs(), std::min(k, count))).min();
}

// Per element, the largest |result − Σ parts| the codec's documented bound allows
// (parallel/compression.h), plus fp32 rounding of the final sums (2^-22 Σ|x|).
at::Tensor errorBound(CodecKind codec, const std::vector<at::Tensor>& parts,
                      const parallel::CodecOptions& options) {
  const double n = static_cast<double>(parts.size());
  at::Tensor magnitude = at::zeros_like(parts.front());
  for (const at::Tensor& part : parts) magnitude += part.abs();
  at::Tensor bound = magnitude * std::ldexp(1.0, -22);
  switch (codec) {
    case CodecKind::kFp16:  // n·2^-11·Σ|x|, and 2^-25·n per rank below fp16's normal range
      return bound + magnitude * n * std::ldexp(1.0, -11) + n * n * std::ldexp(1.0, -25);
    case CodecKind::kBf16:
      return bound + magnitude * n * std::ldexp(1.0, -8);
    case CodecKind::kInt8:
      for (const at::Tensor& part : parts) bound += int8Bound(part, options.int8_chunk);
      return bound;
    case CodecKind::kTopK:
      for (const at::Tensor& part : parts) bound += topKBound(part, options.topk_ratio);
      return bound;
    case CodecKind::kPowerSgd: {  // rank 1 ≤ r: exact to fp32 rounding of M Q, Mᵀ P and P Qᵀ
      const auto shape = matrixShape(parts.front().numel());
      return bound +
             magnitude.max() * static_cast<double>(shape[0] + shape[1]) * std::ldexp(1.0, -24);
    }
    case CodecKind::kNone:
      break;
  }
  return bound;
}

}  // namespace

bool supportedVariant(const AllReduceVariant& variant) {
  return variant.algorithm != "2d" || variant.codec == "none";
}

void checkVariantNames(const std::vector<std::string>& algorithms,
                       const std::vector<std::string>& codecs) {
  for (const std::string& algorithm : algorithms)
    if (algorithm != "flat" && algorithm != "hierarchical" && algorithm != "2d")
      CHORUS_THROW(ConfigError, "bench comm: unknown algorithm '", algorithm,
                   "'; expected flat, hierarchical or 2d");
  for (const std::string& codec : codecs)
    if (codec != "none" && codec != "fp16" && codec != "bf16" && codec != "int8" &&
        codec != "topk" && codec != "powersgd")
      CHORUS_THROW(ConfigError, "bench comm: unknown codec '", codec,
                   "'; expected none, fp16, bf16, int8, topk or powersgd");
}

AllReduceBench::AllReduceBench(std::shared_ptr<comm::Communicator> comm, comm::Topology topology)
    : comm_(std::move(comm)), topology_(std::move(topology)) {}

AllReduceBench::~AllReduceBench() = default;

comm::HierarchicalAllReduce& AllReduceBench::engine(const std::string& algorithm) {
  auto& slot = engines_[algorithm];
  if (!slot) {
    comm::HierarchicalOptions options;
    options.algorithm = comm::parseAllReduceAlgorithm(algorithm);
    options.name = comm_->name() + "-" + algorithm;
    slot = std::make_unique<comm::HierarchicalAllReduce>(comm_, topology_, options);
  }
  return *slot;
}

void AllReduceBench::run(const AllReduceVariant& variant, at::Tensor& buffer,
                         parallel::GradientCodec* codec, comm::ReduceOp op) {
  const bool flat = variant.algorithm == "flat";
  if (!codec && flat) return comm_->allReduce(buffer, op).wait();
  if (!codec) return engine(variant.algorithm).allReduce(buffer, op).wait();
  const parallel::FlatLayout layout{{{kKey, 0, matrixShape(buffer.numel())}}};
  if (flat) return codec->allReduce(kKey, buffer, layout, *comm_);
  auto leaders = [&](at::Tensor& tensor, comm::Communicator& group) {
    codec->allReduce(kKey, tensor, layout, group);
  };
  engine(variant.algorithm).allReduce(buffer, comm::ReduceOp::kSum, leaders).wait();
}

std::int64_t AllReduceBench::checkedRun(const AllReduceVariant& variant, const MeasureSpec& spec,
                                        std::int64_t count) {
  const CodecKind kind = parallel::parseCodecKind(variant.codec);
  if (kind == CodecKind::kNone) {
    at::Tensor buffer = benchPattern(comm_->rank(), 0, count, spec.type);
    run(variant, buffer, nullptr, spec.reduce);
    const at::Tensor expected = expectedReduction(comm_->size(), 0, count, spec.type, spec.reduce);
    return buffer.ne(expected).sum().item<std::int64_t>();
  }
  // A fresh codec (no residual, no warm start): the one-shot bounds hold.
  parallel::CodecOptions options;
  options.kind = kind;
  auto codec = parallel::makeCodec(options);
  at::Tensor buffer = inputOf(comm_->rank(), count, kind);
  run(variant, buffer, codec.get(), comm::ReduceOp::kSum);
  const auto parts = contributions(topology_, variant.algorithm == "flat", count, kind);
  at::Tensor expected = at::zeros({count}, at::kDouble);
  for (const at::Tensor& part : parts) expected += part;
  const at::Tensor error = (buffer.to(at::kDouble) - expected).abs();
  return error.gt(errorBound(kind, parts, options)).sum().item<std::int64_t>();
}

BenchRow AllReduceBench::measure(const AllReduceVariant& variant, const MeasureSpec& spec) {
  const CodecKind kind = parallel::parseCodecKind(variant.codec);
  if (!supportedVariant(variant) ||
      (kind != CodecKind::kNone &&
       (spec.type != at::kFloat || spec.reduce != comm::ReduceOp::kSum)))
    CHORUS_THROW(ConfigError, "bench comm: ", variant.algorithm, " all-reduce with codec ",
                 variant.codec, " needs float32, sum and a flat or hierarchical algorithm");
  const auto element = static_cast<std::int64_t>(c10::elementSize(spec.type));
  const std::int64_t count =
      std::max<std::int64_t>(static_cast<std::int64_t>(spec.bytes) / element, 1);
  parallel::CodecOptions options;
  options.kind = kind;
  auto codec = kind == CodecKind::kNone ? nullptr : parallel::makeCodec(options);
  at::Tensor buffer = at::zeros({count}, at::TensorOptions().dtype(spec.type));
  for (int i = 0; i < spec.warmup; ++i) run(variant, buffer, codec.get(), spec.reduce);
  comm_->barrier().wait();
  Stopwatch clock;
  for (int i = 0; i < spec.iters; ++i) run(variant, buffer, codec.get(), spec.reduce);
  const double local = clock.seconds() / std::max(1, spec.iters);
  const std::int64_t wrong = checkedRun(variant, spec, count);

  BenchRow row;
  row.op = "all_reduce";
  row.count = count;
  row.size = static_cast<std::uint64_t>(count * element);
  row.type = spec.type_name;
  row.reduce = comm::toString(spec.reduce);
  row.time_s = slowestRank(*comm_, local);
  row.algbw = row.time_s > 0 ? static_cast<double>(row.size) / row.time_s / 1e9 : 0.0;
  row.busbw = row.algbw * 2.0 * (comm_->size() - 1) / comm_->size();
  row.wrong = sumOverRanks(*comm_, wrong);
  row.backend = comm_->cpuTransport();
  row.algorithm = variant.algorithm;
  row.codec = variant.codec;
  return row;
}

}  // namespace chorus::cli
