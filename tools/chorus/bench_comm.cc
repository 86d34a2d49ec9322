// `chorus bench comm`: the front end that starts local ranks through the node agent (as
// `chorus run` does), and the rank's loop over transports, operations and sizes.
#include "bench_comm.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench_comm_allreduce.h"
#include "bench_comm_measure.h"
#include "chorus/chorus.h"
#include "chorus/core/units.h"
#include "chorus/runtime/launch/agent.h"
#include "commands.h"

namespace chorus::cli {
namespace {

struct TypeName {
  const char* name;
  c10::ScalarType type;
};

constexpr TypeName kTypes[] = {
    {"float32", c10::ScalarType::Float},     {"float64", c10::ScalarType::Double},
    {"bfloat16", c10::ScalarType::BFloat16}, {"float16", c10::ScalarType::Half},
    {"int32", c10::ScalarType::Int},         {"int64", c10::ScalarType::Long}};

c10::ScalarType parseType(const std::string& name) {
  for (const TypeName& entry : kTypes)
    if (name == entry.name) return entry.type;
  CHORUS_THROW(ConfigError, "bench comm: unknown type '", name,
               "'; expected float32, float64, bfloat16, float16, int32 or int64");
}

comm::ReduceOp parseReduce(const std::string& name) {
  for (comm::ReduceOp op :
       {comm::ReduceOp::kSum, comm::ReduceOp::kAvg, comm::ReduceOp::kMax, comm::ReduceOp::kMin})
    if (name == comm::toString(op)) return op;
  CHORUS_THROW(ConfigError, "bench comm: unknown reduction '", name,
               "'; expected sum, avg, max or min");
}

std::string normalizedOp(std::string op) {
  for (char& c : op)
    if (c == '-') c = '_';
  if (!knownBenchOp(op))
    CHORUS_THROW(ConfigError, "bench comm: unknown operation '", op,
                 "'; expected all_reduce, all_gather, reduce_scatter, broadcast or all_to_all");
  return op;
}

std::vector<std::uint64_t> sizesOf(const BenchCommArgs& args) {
  const std::uint64_t first = parseBytes(args.min_bytes);
  const std::uint64_t last = parseBytes(args.max_bytes);
  if (first == 0 || last < first || args.factor <= 1.0)
    CHORUS_THROW(ConfigError, "bench comm: need 0 < -b <= -e and -f > 1 (got ", args.min_bytes,
                 ", ", args.max_bytes, ", ", args.factor, ")");
  std::vector<std::uint64_t> sizes;
  for (double size = static_cast<double>(first); size <= static_cast<double>(last) * 1.000001;
       size *= args.factor)
    sizes.push_back(static_cast<std::uint64_t>(size));
  return sizes;
}

std::string joined(const std::vector<std::string>& items) {
  std::string text;
  for (const std::string& item : items) text += (text.empty() ? "" : ",") + item;
  return text;
}

// Not under a launcher: become the agent of --ranks local CPU workers running this benchmark.
int startRanks(const BenchCommArgs& args, const std::string& log_level) {
  runtime::AgentOptions agent;
  std::string devices;
  for (int rank = 0; rank < args.ranks; ++rank) devices += rank ? ",cpu" : "cpu";
  agent.devices = parseDeviceSpecs(devices);
  agent.comm_timeout = std::chrono::milliseconds(static_cast<long long>(args.timeout_s * 1000));
  agent.prefix_output = false;
  agent.log_level = log_level;
  std::ostringstream factor;
  factor << args.factor;
  agent.command = {selfExecutable(),
                   "--log-level",
                   log_level,
                   "bench",
                   "comm",
                   "--ops",
                   joined(args.ops),
                   "--transports",
                   joined(args.transports),
                   "--algorithms",
                   joined(args.algorithms),
                   "--codecs",
                   joined(args.codecs),
                   "--group-size",
                   std::to_string(args.group_size),
                   "-b",
                   args.min_bytes,
                   "-e",
                   args.max_bytes,
                   "-f",
                   factor.str(),
                   "-w",
                   std::to_string(args.warmup),
                   "-n",
                   std::to_string(args.iters),
                   "-d",
                   args.dtype,
                   "-o",
                   args.reduce,
                   "--timeout",
                   std::to_string(args.timeout_s)};
  if (!args.shm_chunk.empty())
    agent.command.insert(agent.command.end(), {"--shm-chunk", args.shm_chunk});
  if (args.json) agent.command.push_back("--json");
  return runtime::runAgent(agent);
}

void printHeader(const runtime::Worker& worker, const BenchCommArgs& args) {
  std::printf("# chorus bench comm: %d ranks, %s, reduction %s, warm-up %d, iterations %d\n",
              worker.worldSize(), args.dtype.c_str(), args.reduce.c_str(), args.warmup, args.iters);
  std::printf("# %-7s %-12s %-8s %-14s %10s %11s %-8s %6s %11s %10s %10s %7s\n", "backend",
              "algorithm", "codec", "op", "size", "count", "type", "redop", "time(us)", "algbw",
              "busbw", "#wrong");
  std::printf("# %-7s %-12s %-8s %-14s %10s %11s %-8s %6s %11s %10s %10s %7s\n", "", "", "", "",
              "(B)", "(elements)", "", "", "", "(GB/s)", "(GB/s)", "");
}

void printRow(const BenchRow& row) {
  std::printf("  %-7s %-12s %-8s %-14s %10llu %11lld %-8s %6s %11.2f %10.3f %10.3f %7lld\n",
              row.backend.c_str(), row.algorithm.c_str(), row.codec.c_str(), row.op.c_str(),
              static_cast<unsigned long long>(row.size), static_cast<long long>(row.count),
              row.type.c_str(), row.reduce.c_str(), row.time_s * 1e6, row.algbw, row.busbw,
              static_cast<long long>(row.wrong));
  std::fflush(stdout);
}

nlohmann::json toJson(const std::vector<BenchRow>& rows) {
  nlohmann::json list = nlohmann::json::array();
  for (const BenchRow& row : rows)
    list.push_back({{"op", row.op},
                    {"size", row.size},
                    {"count", row.count},
                    {"type", row.type},
                    {"reduce", row.reduce},
                    {"time_s", row.time_s},
                    {"algbw", row.algbw},
                    {"busbw", row.busbw},
                    {"wrong", row.wrong},
                    {"backend", row.backend},
                    {"algorithm", row.algorithm},
                    {"codec", row.codec}});
  return list;
}

std::shared_ptr<comm::Communicator> groupFor(const runtime::Worker& worker,
                                             const std::string& transport,
                                             const BenchCommArgs& args) {
  comm::CommOptions options;
  options.name = "bench-" + transport;
  options.cpu_transport = transport;
  options.timeout = std::chrono::milliseconds(worker.identity().timeout_ms);
  options.bind_address = worker.identity().bind_address;
  options.host_id = worker.identity().host_id;
  if (!args.shm_chunk.empty()) options.shm_chunk_bytes = parseBytes(args.shm_chunk);
  return comm::Communicator::create(worker.store(), worker.rank(), worker.worldSize(), options);
}

// The groups of the hierarchical and 2-D forms (collective when grouping by host).
comm::Topology topologyFor(const runtime::Worker& worker, comm::Communicator& comm,
                           const BenchCommArgs& args) {
  const int group_size = args.group_size;
  bool grouped = false;
  for (const std::string& algorithm : args.algorithms) grouped |= algorithm != "flat";
  if (!grouped) return comm::Topology::singletons(comm.size());  // the flat form ignores it
  if (group_size <= 0) {
    comm::RankDescriptor self;
    self.host_id = worker.identity().host_id;
    return comm::Topology::discover(comm, self, comm::GroupBy::kHost);
  }
  std::vector<std::vector<int>> groups;
  for (int rank = 0; rank < comm.size(); ++rank) {
    if (rank % group_size == 0) groups.emplace_back();
    groups.back().push_back(rank);
  }
  return comm::Topology::fromGroups(std::move(groups));
}

// The all-reduce rows of one transport: every algorithm, codec and size that exists.
void measureAllReduce(const runtime::Worker& worker, std::shared_ptr<comm::Communicator> comm,
                      const BenchCommArgs& args, MeasureSpec spec, std::vector<BenchRow>& rows) {
  comm::Topology topology = topologyFor(worker, *comm, args);
  if (worker.rank() == 0 && !args.json && !topology.isFlat())
    std::printf("# %s topology: %s\n", comm->cpuTransport(), topology.describe().c_str());
  AllReduceBench bench(comm, std::move(topology));
  spec.op = "all_reduce";
  for (const std::string& algorithm : args.algorithms)
    for (const std::string& codec : args.codecs) {
      if (!supportedVariant({algorithm, codec})) continue;
      for (std::uint64_t bytes : sizesOf(args)) {
        spec.bytes = bytes;
        rows.push_back(bench.measure({algorithm, codec}, spec));
        if (worker.rank() == 0 && !args.json) printRow(rows.back());
      }
    }
}

// Lossy codecs encode float32 gradients and sum them: refuse other types and reductions up front.
void checkCodecs(const BenchCommArgs& args) {
  checkVariantNames(args.algorithms, args.codecs);
  for (const std::string& codec : args.codecs)
    if (codec != "none" && (args.dtype != "float32" || args.reduce != "sum"))
      CHORUS_THROW(ConfigError, "bench comm: codec ", codec, " needs -d float32 and -o sum");
}

// One rank of the job: every transport, operation and size, in the same order on every rank.
int runRank(const BenchCommArgs& args) {
  MeasureSpec spec;
  spec.type = parseType(args.dtype);
  spec.type_name = args.dtype;
  spec.reduce = parseReduce(args.reduce);
  spec.warmup = args.warmup;
  spec.iters = args.iters;
  std::vector<std::string> ops;
  for (const std::string& op : args.ops) ops.push_back(normalizedOp(op));
  const std::vector<std::uint64_t> sizes = sizesOf(args);
  runtime::InitOptions init;
  init.connect = false;
  auto worker = chorus::init(init);
  const bool printer = worker->rank() == 0;
  if (printer && !args.json) printHeader(*worker, args);
  std::vector<BenchRow> rows;
  for (const std::string& transport : args.transports) {
    auto comm = groupFor(*worker, transport, args);
    for (const std::string& op : ops) {
      if (op == "all_reduce") {
        measureAllReduce(*worker, comm, args, spec, rows);
        continue;
      }
      spec.op = op;
      for (std::uint64_t bytes : sizes) {
        spec.bytes = bytes;
        rows.push_back(measureCollective(*comm, spec));
        if (printer && !args.json) printRow(rows.back());
      }
    }
  }
  if (printer && args.json) std::cout << toJson(rows).dump(1) << std::endl;
  return kExitOk;
}

}  // namespace

int runBenchComm(const BenchCommArgs& args, const std::string& log_level) {
  for (const std::string& transport : args.transports)
    if (transport != "gloo" && transport != "shm")
      CHORUS_THROW(ConfigError, "bench comm: unknown transport '", transport,
                   "'; expected gloo or shm");
  checkCodecs(args);
  const runtime::WorkerIdentity identity =
      runtime::identityFromEnvironment(runtime::processEnvironment());
  if (identity.launcher == "none" && args.ranks > 1) return startRanks(args, log_level);
  if (args.ranks < 1) CHORUS_THROW(ConfigError, "bench comm: --ranks must be at least 1");
  return runRank(args);
}

}  // namespace chorus::cli
