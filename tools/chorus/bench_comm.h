// `chorus bench comm`: collective benchmarks in the manner of nccl-tests, over each CPU transport
// (Gloo, shared memory), with results checked against the known answer; all-reduce also for each
// algorithm (flat, hierarchical, 2-D) and gradient codec, lossy ones checked against their bounds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace chorus::cli {

// Options of `chorus bench comm` (docs/cli.md). Value type.
struct BenchCommArgs {
  // Operations: all_reduce, all_gather, reduce_scatter, broadcast, all_to_all (dashes accepted).
  // Default: all five.
  std::vector<std::string> ops = {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                  "all_to_all"};
  // Transports of CPU collectives to measure, each in its own group. Default: gloo and shm.
  std::vector<std::string> transports = {"gloo", "shm"};
  // All-reduce algorithms: flat (the transport's own all-reduce), hierarchical, 2d (comm/
  // hierarchical_all_reduce.h, over the topology below). Default: flat.
  std::vector<std::string> algorithms = {"flat"};
  // All-reduce codecs: none, fp16, bf16, int8, topk, powersgd (parallel/compression.h, default
  // options); lossy ones need float32 and sum, and run with flat or hierarchical (a 2d row with a
  // lossy codec is skipped). Default: none.
  std::vector<std::string> codecs = {"none"};
  // Groups of the hierarchical and 2-D forms: 0 groups the ranks by host; k > 0 makes groups of k
  // consecutive ranks (emulated hosts). Default: 0.
  int group_size = 0;
  // Smallest and largest size, and the factor between sizes. Default: 1K to 64M, x2.
  std::string min_bytes = "1K";
  std::string max_bytes = "64M";
  double factor = 2.0;
  // Untimed iterations before, and timed iterations per size. Default: 5 and 20.
  int warmup = 5;
  int iters = 20;
  // Element type and reduction. Default: float32, sum.
  std::string dtype = "float32";
  std::string reduce = "sum";
  // Local ranks to start when not already running under a launcher. Default: 2.
  int ranks = 2;
  // Shared-memory chunk buffer size (CommOptions::shm_chunk_bytes). Default: "" (the default).
  std::string shm_chunk;
  // Communication deadline in seconds. Default: 60.
  double timeout_s = 60.0;
  // Print a JSON list of rows instead of the table. Default: false.
  bool json = false;
};

// Runs the benchmark: as the agent of --ranks local workers when no launcher started this
// process, else as one rank of the job. Returns the exit code.
int runBenchComm(const BenchCommArgs& args, const std::string& log_level);

}  // namespace chorus::cli
