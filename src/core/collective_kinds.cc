#include "chorus/core/collective_kinds.h"

#include "chorus/core/name_table.h"

namespace chorus {
namespace {

constexpr NamedValue<AllReduceAlgorithm> kAlgorithmNames[] = {
    {AllReduceAlgorithm::kAuto, "auto"},
    {AllReduceAlgorithm::kFlat, "flat"},
    {AllReduceAlgorithm::kHierarchical, "hierarchical"},
    {AllReduceAlgorithm::kTwoD, "2d"}};

constexpr NamedValue<CodecKind> kCodecNames[] = {
    {CodecKind::kNone, "none"}, {CodecKind::kFp16, "fp16"}, {CodecKind::kBf16, "bf16"},
    {CodecKind::kInt8, "int8"}, {CodecKind::kTopK, "topk"}, {CodecKind::kPowerSgd, "powersgd"}};

}  // namespace

const char* toString(AllReduceAlgorithm algorithm) { return nameOf(kAlgorithmNames, algorithm); }

AllReduceAlgorithm parseAllReduceAlgorithm(const std::string& text) {
  return parseNamed(kAlgorithmNames, text, "all-reduce algorithm");
}

const char* toString(CodecKind kind) { return nameOf(kCodecNames, kind); }

CodecKind parseCodecKind(const std::string& text) { return parseNamed(kCodecNames, text, "codec"); }

}  // namespace chorus
