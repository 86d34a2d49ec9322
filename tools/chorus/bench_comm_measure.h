// Private to `chorus bench comm`: one measured row (one operation at one size on one transport).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

#include "chorus/comm/communicator.h"

namespace chorus::cli {

// Value type: one line of the table, one object of the JSON list.
struct BenchRow {
  std::string op;         // "all_reduce", ...
  std::uint64_t size;     // bytes, as nccl-tests counts them (see docs/comm.md)
  std::int64_t count;     // elements of `size`
  std::string type;       // "float32", ...
  std::string reduce;     // "sum", ... or "none"
  double time_s;          // seconds per operation: the mean of the timed iterations, slowest rank
  double algbw;           // GB/s: size / time_s / 1e9
  double busbw;           // GB/s: algbw x the operation's bus factor
  std::int64_t wrong;     // elements that differ from the known answer (all ranks summed)
  std::string backend;    // the transport that ran it: "gloo" or "shm"
  std::string algorithm;  // all-reduce: flat, hierarchical, 2d; else how the transport runs it
  std::string codec;      // gradient compression (all-reduce only; else "none")
};

struct MeasureSpec {
  std::string op;
  std::uint64_t bytes = 0;
  c10::ScalarType type = c10::ScalarType::Float;
  std::string type_name = "float32";
  comm::ReduceOp reduce = comm::ReduceOp::kSum;
  int warmup = 5;
  int iters = 20;
};

// True for the five operation names.
bool knownBenchOp(const std::string& op);

// Rank r's value at index i (i in [first, first + count)): small integers, exact in every type
// and in sums of a few ranks.
at::Tensor benchPattern(int rank, std::int64_t first, std::int64_t count, c10::ScalarType type);

// What every rank holds after reducing the ranks' patterns at [first, first + count) with `op`.
at::Tensor expectedReduction(int ranks, std::int64_t first, std::int64_t count,
                             c10::ScalarType type, comm::ReduceOp op);

// Collective over `comm`: the largest `seconds` of all ranks, and the sum of `count` over ranks.
double slowestRank(comm::Communicator& comm, double seconds);
std::int64_t sumOverRanks(comm::Communicator& comm, std::int64_t count);

// Measures `spec` on `comm`: warm-up, timed iterations (time of the slowest rank), then one
// checked run whose result is compared with the known answer (rank r contributes values from r).
// Collective: every rank of `comm` calls it with the same spec.
BenchRow measureCollective(comm::Communicator& comm, const MeasureSpec& spec);

}  // namespace chorus::cli
