// Private to `chorus bench comm`: all-reduce by algorithm (flat, hierarchical, 2d:
// comm/hierarchical_all_reduce.h) and by codec (none, fp16, bf16, int8, topk, powersgd:
// parallel/compression.h). Lossy codecs are checked against their documented error bounds
// instead of exact equality.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_comm_measure.h"
#include "chorus/comm/hierarchical_all_reduce.h"
#include "chorus/comm/topology.h"
#include "chorus/parallel/compression.h"

namespace chorus::cli {

// One way to all-reduce. Value type.
struct AllReduceVariant {
  std::string algorithm = "flat";  // "flat", "hierarchical" or "2d"
  std::string codec = "none";      // a parallel::CodecKind name
};

// False for the 2-D form with a lossy codec: codecs compress the leaders' all-reduce of the
// hierarchical form (or the whole flat one), not the 2-D form's shards.
bool supportedVariant(const AllReduceVariant& variant);

// Validates the names (ConfigError naming the bad one).
void checkVariantNames(const std::vector<std::string>& algorithms,
                       const std::vector<std::string>& codecs);

// The all-reduce variants of one transport's communicator over one topology. The hierarchical
// engines are created on first use, which is collective: every rank must measure the same
// variants in the same order. Not thread-safe; non-copyable.
class AllReduceBench {
 public:
  AllReduceBench(std::shared_ptr<comm::Communicator> comm, comm::Topology topology);
  ~AllReduceBench();
  AllReduceBench(const AllReduceBench&) = delete;
  AllReduceBench& operator=(const AllReduceBench&) = delete;

  // Times `variant` at spec.bytes (warm-up, barrier, timed calls on zeros, slowest rank), then
  // checks one call on a fresh codec with rank r's pattern. REQUIRES: supportedVariant(variant);
  // a lossy codec needs float32 and sum. Collective over the communicator.
  BenchRow measure(const AllReduceVariant& variant, const MeasureSpec& spec);

 private:
  comm::HierarchicalAllReduce& engine(const std::string& algorithm);
  // One all-reduce of `buffer` (in place): the communicator's own (flat), an engine's, a codec
  // among all ranks (flat) or among the leaders (hierarchical).
  void run(const AllReduceVariant& variant, at::Tensor& buffer, parallel::GradientCodec* codec,
           comm::ReduceOp op);
  // One call on rank r's pattern; returns this rank's elements outside the expected bound.
  std::int64_t checkedRun(const AllReduceVariant& variant, const MeasureSpec& spec,
                          std::int64_t count);

  std::shared_ptr<comm::Communicator> comm_;
  comm::Topology topology_;
  std::map<std::string, std::unique_ptr<comm::HierarchicalAllReduce>> engines_;
};

}  // namespace chorus::cli
