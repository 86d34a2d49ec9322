// `chorus bench`: benchmarks. Each kind is a sub-subcommand; `comm` measures collectives
// (bench_comm.h). Room is left for others (e.g. `bench devices`).
#include "bench_comm.h"
#include "commands.h"

namespace chorus::cli {
namespace {

void addBenchComm(CLI::App& bench, Action& action, CLI::App& app) {
  auto* comm = bench.add_subcommand(
      "comm", "Collective bandwidth per transport, checked against the known answer (nccl-tests)");
  comm->footer(
      "Examples: chorus bench comm\n"
      "          chorus bench comm --ops all_reduce -b 1M -e 64M -f 4 --transports gloo,shm "
      "--json\n"
      "          chorus bench comm --ops all_reduce --ranks 4 --group-size 2 "
      "--algorithms flat,hierarchical,2d --codecs none,fp16,powersgd\n"
      "          chorus run --devices cpu,cpu -- chorus bench comm --ops broadcast");
  auto args = std::make_shared<BenchCommArgs>();
  comm->add_option("--ops", args->ops,
                   "Operations: all_reduce, all_gather, reduce_scatter, broadcast, all_to_all")
      ->delimiter(',')
      ->capture_default_str();
  comm->add_option("--transports", args->transports, "CPU transports: gloo, shm")
      ->delimiter(',')
      ->capture_default_str();
  comm->add_option("--algorithms", args->algorithms,
                   "All-reduce algorithms: flat, hierarchical, 2d")
      ->delimiter(',')
      ->capture_default_str();
  comm->add_option("--codecs", args->codecs,
                   "All-reduce codecs: none, fp16, bf16, int8, topk, powersgd (lossy ones checked "
                   "against their error bounds)")
      ->delimiter(',')
      ->capture_default_str();
  comm->add_option("--group-size", args->group_size,
                   "Ranks per group of the hierarchical and 2d forms (0: one group per host)")
      ->capture_default_str();
  comm->add_option("-b,--min-bytes", args->min_bytes, "Smallest size (1K, 4M, ...)")
      ->capture_default_str();
  comm->add_option("-e,--max-bytes", args->max_bytes, "Largest size")->capture_default_str();
  comm->add_option("-f,--step-factor", args->factor, "Factor between sizes")->capture_default_str();
  comm->add_option("-w,--warmup-iters", args->warmup, "Untimed iterations per size")
      ->capture_default_str();
  comm->add_option("-n,--iters", args->iters, "Timed iterations per size")->capture_default_str();
  comm->add_option("-d,--dtype", args->dtype, "float32, float64, bfloat16, float16, int32 or int64")
      ->capture_default_str();
  comm->add_option("-o,--reduce", args->reduce, "sum, avg, max or min")->capture_default_str();
  comm->add_option("--ranks", args->ranks,
                   "Local ranks to start (ignored under chorus run, mpirun or srun)")
      ->capture_default_str();
  comm->add_option("--shm-chunk", args->shm_chunk,
                   "Chunk buffer of the shared-memory transport (default 1M)");
  comm->add_option("--timeout", args->timeout_s, "Communication deadline, seconds")
      ->check(secondsIn(kMinTimeoutSeconds, kMaxTimeoutSeconds))
      ->capture_default_str();
  comm->add_flag("--json", args->json, "Print a JSON list of rows");
  comm->callback([&action, args, &app] {
    action = [args, &app] {
      return runBenchComm(*args, app.get_option("--log-level")->as<std::string>());
    };
  });
}

}  // namespace

void addBenchCommand(CLI::App& app, Action& action) {
  auto* bench = app.add_subcommand("bench", "Benchmarks: comm (collectives per transport)");
  bench->require_subcommand(1);
  addBenchComm(*bench, action, app);
}

}  // namespace chorus::cli
