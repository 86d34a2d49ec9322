// The vocabulary of gradient collectives: which all-reduce algorithm and which gradient codec.
//
// One enum per concept, here at the bottom of the layers, because three layers speak of them: comm
// runs the algorithms, parallel runs the codecs, and plan prices a subset of both (plan must not
// depend on comm or parallel, which need libtorch). Each layer that accepts only part of an enum
// says so where it reads it (the plan refuses what its cost model cannot price).
#pragma once

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

}  // namespace chorus
