// The vocabulary of gradient collectives: which all-reduce algorithm and which gradient codec.
//
// One enum per concept, here at the bottom of the layers, because three layers speak of them: comm
// runs the algorithms, parallel runs the codecs, and plan prices a subset of both (plan must not
// depend on comm or parallel, which need libtorch). Each layer that accepts only part of an enum
// says so where it reads it (the plan refuses what its cost model cannot price).
#pragma once

#include <cstdint>
#include <string>

namespace chorus {

// How an all-reduce crosses a topology of groups (comm/hierarchical_all_reduce.h has the details).
enum class AllReduceAlgorithm {
  kAuto,          // the communicator picks one of the others per call, by topology and size
  kFlat,          // one all-reduce over all ranks (a ring: the plan spells it "ring")
  kHierarchical,  // reduce in each group, all-reduce among the group leaders, broadcast
  kTwoD,          // reduce-scatter in each group, all-reduce of each shard across groups, gather
};

// "auto", "flat", "hierarchical", "2d": the job's comm.algorithm spelling.
const char* toString(AllReduceAlgorithm algorithm);
// The algorithm named `text` (the spelling of toString); ConfigError listing the names otherwise.
AllReduceAlgorithm parseAllReduceAlgorithm(const std::string& text);

// How a gradient is encoded where it crosses a (slow) link (parallel/compression.h has the codecs
// and their error bounds).
enum class CodecKind { kNone, kFp16, kBf16, kInt8, kTopK, kPowerSgd };

// "none", "fp16", "bf16", "int8", "topk", "powersgd": the job's comm.compression spelling, and the
// plan's.
const char* toString(CodecKind kind);
// The codec named `text` (the spelling of toString); ConfigError listing the names otherwise.
CodecKind parseCodecKind(const std::string& text);

// A codec and its knobs (parallel/compression.h has the codecs' error bounds). The plan carries
// one (plan::CommPlan::codec) from the job or the planner to the engines, which build it with
// parallel::makeCodec. Value type.
struct CodecOptions {
  // Which codec. Default: kNone.
  CodecKind kind = CodecKind::kNone;
  // int8: elements sharing one scale. Default: 256 (the scales add 4/256 = 1.6% to the bytes).
  std::int64_t int8_chunk = 256;
  // topk: fraction of each tensor's elements sent. Default: 0.01 (1%).
  double topk_ratio = 0.01;
  // powersgd: the rank r. Default: 4.
  int powersgd_rank = 4;
  // powersgd: tensors with fewer elements travel uncompressed. Default: 4096.
  std::int64_t powersgd_min_elements = 4096;
  // powersgd: power iterations per call, each one all-reduce of P = M Q and one of Q = Mᵀ P,
  // starting from the previous call's Q. One (the paper's, PyTorch's) follows the best rank-r
  // subspace loosely when the gradient changes fast; two come close to it for twice the factor
  // bytes (zoo GPT, r = 4, AdamW, 200 steps, 3 seeds: +2.5/+3.9/+3.6% final loss over fp32 with
  // two iterations and bf16 factors, +4.7/+4.6/+4.4% with one in fp32, the same bytes).
  // REQUIRES: >= 1. Default: 1.
  int powersgd_iterations = 1;
  // powersgd: P and Q travel and are summed as bfloat16 (half the bytes; each factor and the sum
  // rounded to 8 significant bits, ≈ 2^-8 relative: far below a rank-r approximation's own error,
  // but no longer exact on matrices of rank ≤ r). 1-D and uncompressed tensors stay fp32.
  // Default: false.
  bool powersgd_bf16_factors = false;
  // powersgd: an a×b matrix is compressed only when ab ≥ rate · r(a + b), i.e. when rank r
  // sends at least `rate` times fewer numbers (PyTorch's min_compression_rate); the others
  // travel uncompressed. REQUIRES: >= 1. Default: 2.
  double powersgd_min_compression_rate = 2.0;
  // powersgd: the first calls per key (for the gradient reducer: steps) travel as a plain fp32
  // all-reduce, as PyTorch's start_powerSGD_iter: the first gradients are large and change fast,
  // and what a rank-r approximation drops of them costs more than its bytes save. They count in
  // stats() at full size. REQUIRES: >= 0. Default: 0.
  int powersgd_start_step = 0;
  // powersgd: seed of the initial Q; must be the same on every rank. Default: 42.
  std::uint64_t seed = 42;
  // Carry what the codec dropped into the next step (lossy codecs only). Default: true.
  bool error_feedback = true;

  bool operator==(const CodecOptions&) const = default;
};

}  // namespace chorus
