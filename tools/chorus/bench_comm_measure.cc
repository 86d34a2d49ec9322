#include "bench_comm_measure.h"

#include <ATen/ATen.h>

#include <functional>

#include "chorus/core/clock.h"
#include "chorus/core/error.h"

namespace chorus::cli {
namespace {

using comm::ReduceOp;

// The buffers of one operation and the call that runs it once.
struct Setup {
  at::Tensor input;
  at::Tensor output;  // the same tensor as input for in-place operations
  std::function<void()> run;
  double bus_factor = 1.0;
  std::string algorithm;
};

std::string algorithmOf(const std::string& transport, const std::string& op) {
  if (transport == "shm") {
    if (op == "all_reduce") return "rs+ag";
    if (op == "reduce_scatter") return "slot-reduce";
    return "copy";
  }
  if (op == "reduce_scatter") return "a2a+reduce";
  return "gloo";
}

Setup setUp(comm::Communicator& comm, const MeasureSpec& spec, int64_t count) {
  const int n = comm.size();
  const int64_t block = count / n;
  const auto options = at::TensorOptions().dtype(spec.type);
  Setup setup;
  setup.algorithm = algorithmOf(comm.cpuTransport(), spec.op);
  if (spec.op == "all_reduce") {
    setup.input = setup.output = at::zeros({count}, options);
    setup.bus_factor = 2.0 * (n - 1) / n;
    setup.run = [&comm, t = setup.input, op = spec.reduce]() mutable {
      comm.allReduce(t, op).wait();
    };
  } else if (spec.op == "all_gather") {
    setup.input = at::zeros({block}, options);
    setup.output = at::zeros({count}, options);
    setup.bus_factor = static_cast<double>(n - 1) / n;
    setup.run = [&comm, in = setup.input, out = setup.output]() mutable {
      comm.allGather(in, out).wait();
    };
  } else if (spec.op == "reduce_scatter") {
    setup.input = at::zeros({count}, options);
    setup.output = at::zeros({block}, options);
    setup.bus_factor = static_cast<double>(n - 1) / n;
    setup.run = [&comm, in = setup.input, out = setup.output, op = spec.reduce]() mutable {
      comm.reduceScatter(in, out, op).wait();
    };
  } else if (spec.op == "broadcast") {
    setup.input = setup.output = at::zeros({count}, options);
    setup.run = [&comm, t = setup.input]() mutable { comm.broadcast(t, 0).wait(); };
  } else if (spec.op == "all_to_all") {
    setup.input = at::zeros({count}, options);
    setup.output = at::zeros({count}, options);
    setup.bus_factor = static_cast<double>(n - 1) / n;
    const std::vector<int64_t> counts(n, block);
    setup.run = [&comm, in = setup.input, out = setup.output, counts]() mutable {
      comm.allToAll(in, out, counts, counts).wait();
    };
  } else {
    CHORUS_THROW(ConfigError, "bench comm: unknown operation '", spec.op, "'");
  }
  return setup;
}

// Fills the inputs with this rank's pattern; returns what this rank's output must then be.
at::Tensor prepareCheck(comm::Communicator& comm, const MeasureSpec& spec, Setup& setup,
                        int64_t count) {
  const int rank = comm.rank();
  const int n = comm.size();
  const int64_t block = count / n;
  setup.input.copy_(benchPattern(rank, 0, setup.input.numel(), spec.type));
  if (spec.op == "all_reduce") return expectedReduction(n, 0, count, spec.type, spec.reduce);
  if (spec.op == "reduce_scatter")
    return expectedReduction(n, rank * block, block, spec.type, spec.reduce);
  if (spec.op == "broadcast") return benchPattern(0, 0, count, spec.type);
  std::vector<at::Tensor> pieces;
  for (int peer = 0; peer < n; ++peer)
    pieces.push_back(spec.op == "all_gather" ? benchPattern(peer, 0, block, spec.type)
                                             : benchPattern(peer, rank * block, block, spec.type));
  return at::cat(pieces);
}

}  // namespace

at::Tensor benchPattern(int rank, int64_t first, int64_t count, c10::ScalarType type) {
  at::Tensor index = at::arange(first, first + count, at::kDouble);
  return (at::remainder(index * 7 + rank * 3, 11) - 5 + rank).to(type);
}

at::Tensor expectedReduction(int ranks, int64_t first, int64_t count, c10::ScalarType type,
                             ReduceOp op) {
  std::vector<at::Tensor> all;
  for (int rank = 0; rank < ranks; ++rank)
    all.push_back(benchPattern(rank, first, count, at::kDouble));
  at::Tensor stacked = at::stack(all);
  switch (op) {
    case ReduceOp::kSum:
      return stacked.sum(0).to(type);
    case ReduceOp::kAvg:
      return stacked.sum(0).to(type == at::kDouble ? at::kDouble : at::kFloat).div(ranks).to(type);
    case ReduceOp::kMax:
      return std::get<0>(stacked.max(0)).to(type);
    case ReduceOp::kMin:
      return std::get<0>(stacked.min(0)).to(type);
  }
  return {};
}

double slowestRank(comm::Communicator& comm, double seconds) {
  at::Tensor value = at::full({1}, seconds, at::kDouble);
  comm.allReduce(value, ReduceOp::kMax).wait();
  return value.item<double>();
}

int64_t sumOverRanks(comm::Communicator& comm, int64_t count) {
  at::Tensor value = at::full({1}, count, at::kLong);
  comm.allReduce(value, ReduceOp::kSum).wait();
  return value.item<int64_t>();
}

bool knownBenchOp(const std::string& op) {
  return op == "all_reduce" || op == "all_gather" || op == "reduce_scatter" || op == "broadcast" ||
         op == "all_to_all";
}

BenchRow measureCollective(comm::Communicator& comm, const MeasureSpec& spec) {
  const auto element = static_cast<int64_t>(c10::elementSize(spec.type));
  const bool per_rank_blocks = spec.op != "all_reduce" && spec.op != "broadcast";
  int64_t count = static_cast<int64_t>(spec.bytes) / element;
  if (per_rank_blocks) count = count / comm.size() * comm.size();
  count = std::max<int64_t>(count, per_rank_blocks ? comm.size() : 1);
  Setup setup = setUp(comm, spec, count);
  for (int i = 0; i < spec.warmup; ++i) setup.run();
  comm.barrier().wait();
  Stopwatch clock;
  for (int i = 0; i < spec.iters; ++i) setup.run();
  const double local = clock.seconds() / std::max(1, spec.iters);
  const at::Tensor expected = prepareCheck(comm, spec, setup, count);
  setup.run();
  const int64_t wrong = setup.output.ne(expected).sum().item<int64_t>();

  BenchRow row;
  row.op = spec.op;
  row.count = count;
  row.size = static_cast<std::uint64_t>(count * element);
  row.type = spec.type_name;
  row.reduce =
      spec.op == "all_reduce" || spec.op == "reduce_scatter" ? comm::toString(spec.reduce) : "none";
  row.time_s = slowestRank(comm, local);
  row.algbw = row.time_s > 0 ? static_cast<double>(row.size) / row.time_s / 1e9 : 0.0;
  row.busbw = row.algbw * setup.bus_factor;
  row.wrong = sumOverRanks(comm, wrong);
  row.backend = comm.cpuTransport();
  row.algorithm = setup.algorithm;
  row.codec = "none";
  return row;
}

}  // namespace chorus::cli
