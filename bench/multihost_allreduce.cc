// All-reduce across hosts joined by a slow link: flat vs. hierarchical vs. 2-D vs. hierarchical
// with a codec among the host leaders (fp16, PowerSGD), with the bytes that really crossed the
// link. One rank of a job started by `chorus run` on each host (bench/multihost.py starts it in
// network namespaces, scripts/netns_hosts):
//
//   multihost_allreduce [--bytes 64M] [--iters 3] [--warmup 1] [--link eth0]
//                       [--modes flat,hierarchical,2d,hierarchical+fp16,hierarchical+powersgd]
//                       [--powersgd-rank 4] [--error-feedback 1|0] [--out FILE.json]
//
// Per mode: `warmup` untimed calls, then `iters` timed ones (barrier before each; a call's time is
// the slowest rank's). Rank 0 reads its host's link counters (/sys/class/net/LINK/statistics)
// around the timed calls: every byte there crossed the slow link (the intra-host traffic goes
// through loopback). Rank r contributes (r+1)·u vᵀ, a rank-1 matrix, so every mode's exact answer
// is known (PowerSGD is exact on it up to fp32 rounding) and each row carries its relative error.
#include <ATen/ATen.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "chorus/chorus.h"
#include "chorus/comm/hierarchical_all_reduce.h"
#include "chorus/comm/topology.h"
#include "chorus/core/clock.h"
#include "chorus/core/units.h"
#include "chorus/parallel/compression.h"

namespace {

using namespace chorus;

struct Args {
  std::int64_t bytes = 64ll << 20;
  int iters = 3;
  int warmup = 1;
  std::string link = "eth0";
  std::vector<std::string> modes = {"flat", "hierarchical", "2d", "hierarchical+fp16",
                                    "hierarchical+powersgd"};
  int powersgd_rank = 4;
  bool error_feedback = true;
  std::string out;
};

std::vector<std::string> splitList(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ','))
    if (!item.empty()) items.push_back(item);
  return items;
}

Args parseArgs(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) CHORUS_THROW(ConfigError, "flag ", flag, " needs a value");
    const std::string value = argv[++i];
    if (flag == "--bytes")
      args.bytes = static_cast<std::int64_t>(parseBytes(value));
    else if (flag == "--iters")
      args.iters = std::stoi(value);
    else if (flag == "--warmup")
      args.warmup = std::stoi(value);
    else if (flag == "--link")
      args.link = value;
    else if (flag == "--modes")
      args.modes = splitList(value);
    else if (flag == "--powersgd-rank")
      args.powersgd_rank = std::stoi(value);
    else if (flag == "--error-feedback")
      args.error_feedback = value != "0" && value != "off";
    else if (flag == "--out")
      args.out = value;
    else
      CHORUS_THROW(ConfigError, "unknown flag ", flag);
  }
  if (args.iters < 1 || args.bytes < 4096)
    CHORUS_THROW(ConfigError, "need --iters >= 1, --bytes >= 4K");
  return args;
}

// Bytes this host's link has sent and received so far (0 when the counters are unreadable).
std::pair<std::uint64_t, std::uint64_t> linkCounters(const std::string& link) {
  auto read = [&](const char* what) {
    std::ifstream file("/sys/class/net/" + link + "/statistics/" + what);
    std::uint64_t value = 0;
    file >> value;
    return value;
  };
  return {read("tx_bytes"), read("rx_bytes")};
}

// The buffer viewed as a near-square matrix, so PowerSGD sees one [rows, cols] tensor.
std::vector<std::int64_t> matrixShape(std::int64_t numel) {
  std::int64_t rows = 1;
  while (rows * rows * 4 <= numel && numel % (rows * 2) == 0) rows *= 2;
  return {rows, numel / rows};
}

struct Mode {
  comm::AllReduceAlgorithm algorithm = comm::AllReduceAlgorithm::kFlat;
  parallel::CodecKind codec = parallel::CodecKind::kNone;
};

Mode parseMode(const std::string& name) {
  const auto plus = name.find('+');
  Mode mode;
  mode.algorithm = comm::parseAllReduceAlgorithm(name.substr(0, plus));
  if (plus != std::string::npos) mode.codec = parallel::parseCodecKind(name.substr(plus + 1));
  return mode;
}

struct Result {
  double seconds = 0;         // mean per call, slowest rank
  double link_tx = 0;         // bytes per call host 0's link sent
  double link_rx = 0;         // ... and received
  double codec_wire = 0;      // bytes per call a leader's codec sent (ring model)
  double relative_error = 0;  // max |result - exact| / max |exact|, last call
};

Result measure(const std::string& name, const Args& args, comm::Communicator& world,
               const std::shared_ptr<comm::Communicator>& world_ptr, const comm::Topology& topology,
               const at::Tensor& source, const at::Tensor& exact) {
  const Mode mode = parseMode(name);
  comm::HierarchicalOptions options;
  options.algorithm = mode.algorithm;
  options.name = "bench-" + std::to_string(static_cast<int>(mode.algorithm)) + "-" +
                 std::to_string(static_cast<int>(mode.codec));
  comm::HierarchicalAllReduce engine(world_ptr, topology, options);
  std::shared_ptr<parallel::GradientCodec> codec;
  comm::LeaderReduce hook;
  parallel::FlatLayout layout;
  layout.entries.push_back({"buffer", 0, matrixShape(source.numel())});
  if (mode.codec != parallel::CodecKind::kNone) {
    parallel::CodecOptions codec_options;
    codec_options.kind = mode.codec;
    codec_options.powersgd_rank = args.powersgd_rank;
    codec_options.error_feedback = args.error_feedback;
    codec = parallel::makeCodec(codec_options);
    hook = [codec, layout](at::Tensor& tensor, comm::Communicator& leaders) {
      codec->allReduce("buffer", tensor, layout, leaders);
    };
  }
  at::Tensor buffer = source.clone();
  auto call = [&] {
    buffer.copy_(source);
    world.barrier().wait();
    Stopwatch clock;
    engine.allReduce(buffer, comm::ReduceOp::kSum, hook).wait();
    return clock.seconds();
  };
  for (int i = 0; i < args.warmup; ++i) call();
  const std::uint64_t wire_before = codec ? codec->stats().wire_bytes : 0;
  const auto [tx0, rx0] = linkCounters(args.link);
  double seconds = 0;
  for (int i = 0; i < args.iters; ++i) seconds += call();
  const auto [tx1, rx1] = linkCounters(args.link);
  at::Tensor slowest = at::full({1}, seconds / args.iters, at::kDouble);
  world.allReduce(slowest, comm::ReduceOp::kMax).wait();
  Result result;
  result.seconds = slowest.item<double>();
  result.link_tx = static_cast<double>(tx1 - tx0) / args.iters;
  result.link_rx = static_cast<double>(rx1 - rx0) / args.iters;
  if (codec)
    result.codec_wire = static_cast<double>(codec->stats().wire_bytes - wire_before) / args.iters;
  result.relative_error = ((buffer - exact).abs().max() / exact.abs().max()).item<double>();
  return result;
}

std::string jsonRow(const std::string& mode, const Args& args, int world_size, const Result& r) {
  const double algbw = static_cast<double>(args.bytes) / r.seconds;
  std::ostringstream row;
  row << "{\"mode\": \"" << mode << "\", \"bytes\": " << args.bytes << ", \"ranks\": " << world_size
      << ", \"time_s\": " << r.seconds << ", \"algbw_gbs\": " << algbw / 1e9
      << ", \"busbw_gbs\": " << algbw * 2.0 * (world_size - 1) / world_size / 1e9
      << ", \"link_tx_bytes\": " << r.link_tx << ", \"link_rx_bytes\": " << r.link_rx
      << ", \"error_feedback\": " << (args.error_feedback ? "true" : "false")
      << ", \"codec_wire_bytes\": " << r.codec_wire << ", \"relative_error\": " << r.relative_error
      << "}";
  return row.str();
}

int run(int argc, char** argv) {
  const Args args = parseArgs(argc, argv);
  auto worker = chorus::init();
  auto world = worker->world();
  comm::RankDescriptor self;
  self.host_id = worker->identity().host_id;
  const comm::Topology topology = comm::Topology::discover(*world, self, comm::GroupBy::kHost);
  const std::int64_t numel = args.bytes / 4;
  const auto shape = matrixShape(numel);
  const at::Tensor u = at::linspace(1.0, 2.0, shape[0], at::kFloat);
  const at::Tensor v = at::linspace(-1.0, 1.0, shape[1], at::kFloat);
  const at::Tensor pattern = at::outer(u, v).reshape({-1}).contiguous();
  const at::Tensor source = pattern * static_cast<float>(world->rank() + 1);
  const int n = world->size();
  const at::Tensor exact = pattern * static_cast<float>(n * (n + 1) / 2);
  if (world->rank() == 0)
    std::cout << "multihost_allreduce: " << formatBytes(static_cast<std::uint64_t>(args.bytes))
              << " fp32 over " << topology.describe() << std::endl;
  std::vector<std::string> rows;
  for (const std::string& mode : args.modes) {
    const Result result = measure(mode, args, *world, world, topology, source, exact);
    rows.push_back(jsonRow(mode, args, n, result));
    if (world->rank() == 0) std::cout << rows.back() << std::endl;
  }
  if (world->rank() == 0 && !args.out.empty()) {
    std::ofstream out(args.out);
    out << "[\n";
    for (size_t i = 0; i < rows.size(); ++i)
      out << "  " << rows[i] << (i + 1 < rows.size() ? ",\n" : "\n");
    out << "]\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    std::cerr << "multihost_allreduce: " << error.what() << std::endl;
    return 1;
  }
}
