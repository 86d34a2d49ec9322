// `chorus train`: the built-in trainer. The command validates the whole job first (with plan =
// "auto" it plans the job on the measured devices and adds the plan's settings), then becomes
// the node agent and starts one worker per device; each worker re-reads the same configuration
// (`--worker`) and runs the Trainer (data parallel), or the PipelineTrainer when [parallel]
// pipeline_stages > 1. Rank 0 prints progress and writes --log-json.
#include <signal.h>
#include <unistd.h>

#include <csignal>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>

#include "chorus/chorus.h"
#include "chorus/core/config.h"
#include "chorus/device/discovery.h"
#include "chorus/observe/trace_recorder.h"
#include "chorus/runtime/agent.h"
#include "chorus/runtime/checkpoint.h"
#include "chorus/runtime/job_config.h"
#include "chorus/runtime/pipeline_trainer.h"
#include "chorus/runtime/trainer.h"
#include "commands.h"
#include "train_metrics.h"
#include "train_report.h"

namespace chorus::cli {
namespace {

struct TrainArgs {
  std::string config_path;
  std::vector<std::string> settings;
  std::int64_t steps = 0;
  std::string log_json;
  // A timeline of the steps in trace_steps (A:B), Chrome trace-event JSON (observe layer).
  std::string trace;
  std::string trace_steps = "0:20";
  // Prometheus metrics and the live page on this port (-1: off; 0: a free one), served by the
  // node's agent; workers report to it on a node-local socket (observe layer).
  int metrics_port = -1;
  std::string metrics_socket;  // a worker's: where its agent receives
  std::string resume;
  bool worker = false;
  // Several nodes (as `chorus run`): every node runs `chorus train` with the same config.
  int nnodes = 1;
  int node_rank = 0;
  std::string rdzv_endpoint;
  std::string secret_file;
};

// Set by SIGTERM/SIGINT in a worker: the trainer polls it once per step, every rank agrees to
// stop, writes a checkpoint and returns. A signal handler can reach nothing but a global.
volatile std::sig_atomic_t g_stop_requested = 0;

void requestStop(int) { g_stop_requested = 1; }

void catchStopSignals() {
  struct sigaction action {};
  action.sa_handler = requestStop;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGTERM, &action, nullptr);
  ::sigaction(SIGINT, &action, nullptr);
}

Config loadConfig(const TrainArgs& args) {
  Config config = args.config_path.empty()
                      ? Config::parseString(runtime::defaultJobToml(), "<built-in default job>")
                      : Config::parseFile(args.config_path);
  for (const std::string& setting : args.settings) config.set(setting);
  if (args.steps > 0) config.set("train.steps=" + std::to_string(args.steps));
  return config;
}

std::string selfExecutable() {
  char path[4096];
  const ssize_t length = readlink("/proc/self/exe", path, sizeof path - 1);
  if (length <= 0) CHORUS_THROW(LaunchError, "cannot find the chorus executable (/proc/self/exe)");
  return std::string(path, static_cast<size_t>(length));
}

// Checks what can be checked before any process starts: device specs against this host, the
// global batch against the device count, the data files, and that each memory budget holds a
// sample.
std::vector<DeviceSpec> validateOnHost(const runtime::JobConfig& job) {
  const auto found = device::discoverDevices();
  const std::vector<DeviceSpec> devices = device::expandAuto(job.devices, found);
  device::validateSpecs(devices, found);
  if (job.parallel.pipeline_stages > 1)
    runtime::validatePipelineJob(job, devices);
  else
    runtime::validateJobOnDevices(job, devices);
  return devices;
}

// plan = "auto": measures the job's devices, plans, prints the choice in one line and applies its
// settings to `config` (this process) and to `argv` (every worker's command line), so that all
// processes read one fully specified job and no worker plans on its own.
void applyAutoPlan(const TrainArgs& args, Config& config, std::vector<std::string>& argv) {
  CHORUS_CHECK_CONFIG(args.nnodes == 1,
                      "config key 'plan': plan = \"auto\" plans one node's devices; with --nnodes "
                      "> 1 set [parallel] or balancer.shares by hand (plan = \"manual\")");
  const runtime::JobConfig job = runtime::readJobConfig(config);
  const auto found = device::discoverDevices();
  const std::vector<DeviceSpec> devices = device::expandAuto(job.devices, found);
  device::validateSpecs(devices, found);
  const runtime::PlannedJob planned =
      runtime::planJob(job, devices, runtime::measureJobDevices(devices));
  std::cout << "chorus train: " << planned.summary << std::endl;
  for (const std::string& setting : planned.settings) {
    config.set(setting);
    argv.insert(argv.end(), {"--set", setting});
  }
}

// The parts of --trace that workers on this node wrote (<trace>.rank<N>).
std::vector<std::string> traceParts(const std::string& trace) {
  const std::filesystem::path path(trace);
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : ".";
  const std::string prefix = path.filename().string() + ".rank";
  std::vector<std::string> parts;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > prefix.size() && name.rfind(prefix, 0) == 0 &&
        name.find_first_not_of("0123456789", prefix.size()) == std::string::npos)
      parts.push_back(entry.path().string());
  }
  std::sort(parts.begin(), parts.end());
  return parts;
}

// --trace: refused where it would record nothing, and a path that cannot be written fails now,
// not after training.
void checkTraceRequest(const TrainArgs& args, const runtime::JobConfig& job) {
  if (args.trace.empty()) return;
  observe::parseTraceSteps(args.trace_steps);
  CHORUS_CHECK_CONFIG(job.parallel.pipeline_stages <= 1,
                      "--trace records data-parallel training only; pipelines "
                      "(parallel.pipeline_stages > 1) are not traced yet");
  observe::checkTraceWritable(args.trace);
  // Parts an earlier run left would be merged into this one's timeline.
  for (const std::string& stale : traceParts(args.trace)) std::remove(stale.c_str());
}

// Merges the parts of --trace that this node's workers wrote into one file and removes them.
void mergeTrace(const std::string& trace) {
  const std::vector<std::string> parts = traceParts(trace);
  if (parts.empty()) return;
  const int merged = observe::mergeTraceParts(parts, trace);
  for (const std::string& part : parts) std::remove(part.c_str());
  std::cout << "chorus train: wrote the timeline of " << merged << " ranks to " << trace
            << std::endl;
}

int runFrontEnd(const TrainArgs& args, std::vector<std::string> argv) {
  Config config = loadConfig(args);
  if (runtime::readJobConfig(config).plan == "auto") applyAutoPlan(args, config, argv);
  const runtime::JobConfig job = runtime::readJobConfig(config);
  checkTraceRequest(args, job);
  // Listening now: a busy or privileged port is refused before anything else starts.
  std::unique_ptr<observe::NodeMonitor> monitor;
  if (args.metrics_port >= 0) monitor = startTrainMonitor(args.metrics_port, args.node_rank);
  // Rank 0 writes the log once the workers run; a path it cannot write is better refused now
  // than as a worker's failure after the job started.
  if (!args.log_json.empty() && !std::ofstream(args.log_json, std::ios::trunc))
    CHORUS_THROW(ConfigError, "--log-json: cannot write ", args.log_json);
  runtime::AgentOptions agent;
  agent.devices = validateOnHost(job);
  agent.cpu_transport = job.comm.cpu_transport;
  agent.nnodes = args.nnodes;
  agent.node_rank = args.node_rank;
  agent.rdzv_endpoint = args.rdzv_endpoint;
  agent.secret_file = args.secret_file;
  agent.comm_timeout = std::chrono::milliseconds(static_cast<long long>(job.comm.timeout_s * 1000));
  // Checkpointing workers finish their step and write a checkpoint when stopped: give them time.
  if (!job.checkpoint.dir.empty()) agent.grace = std::chrono::milliseconds(60000);
  agent.command = {selfExecutable(), "train"};
  agent.command.insert(agent.command.end(), argv.begin(), argv.end());
  if (!args.resume.empty()) {
    // Resolved once here, so that every worker resumes from the same checkpoint and a missing
    // or damaged one is reported before anything starts.
    const std::string dir = runtime::resolveCheckpoint(args.resume, job.checkpoint.dir);
    runtime::validateResume(job, dir);
    std::cout << "chorus train: resuming from " << dir << std::endl;
    agent.command.insert(agent.command.end(), {"--resume", dir});
  }
  if (monitor)
    agent.command.insert(agent.command.end(), {"--metrics-socket", monitor->socketPath()});
  agent.command.push_back("--worker");
  const int code = runtime::runAgent(agent);
  if (!args.trace.empty()) mergeTrace(args.trace);
  return code;
}

// Runs a Trainer or a PipelineTrainer (same interface) to the end of the job.
template <typename AnyTrainer>
int train(const TrainArgs& args, const runtime::JobConfig& job,
          std::shared_ptr<runtime::Worker> worker) {
  AnyTrainer trainer(job, worker);
  if (!args.resume.empty()) trainer.resume(args.resume);
  TrainReport report(job, worker->rank() == 0, args.log_json);
  runtime::TrainerHooks hooks;
  std::unique_ptr<TrainMetrics> metrics;
  if (!args.metrics_socket.empty())
    metrics = std::make_unique<TrainMetrics>(args.metrics_socket, worker, job.train.global_batch);
  hooks.on_step = [&](const runtime::StepRecord& record) {
    report.step(record);
    if (metrics) metrics->step(record);
  };
  hooks.stop_requested = [] { return g_stop_requested != 0; };
  std::unique_ptr<observe::TraceRecorder> trace;
  if (!args.trace.empty()) {
    const auto& identity = worker->identity();
    trace = std::make_unique<observe::TraceRecorder>(
        worker->rank(), identity.node_rank,
        "rank " + std::to_string(worker->rank()) + " (" + identity.device.toString() + ")",
        observe::parseTraceSteps(args.trace_steps));
    hooks.trace = trace.get();
  }
  const runtime::TrainResult result = trainer.run(hooks);
  if (trace) trace->writePart(observe::tracePartPath(args.trace, worker->rank()));
  report.finish(result);
  return kExitOk;
}

int runWorker(const TrainArgs& args) {
  const runtime::JobConfig job = runtime::readJobConfig(loadConfig(args));
  auto worker = chorus::init();
  catchStopSignals();
  if (job.parallel.pipeline_stages > 1) return train<runtime::PipelineTrainer>(args, job, worker);
  return train<runtime::Trainer>(args, job, worker);
}

}  // namespace

void addTrainCommand(CLI::App& app, Action& action) {
  auto* train = app.add_subcommand(
      "train",
      "Train a model on this node's devices: heterogeneous data parallelism, or pipelines "
      "([parallel] pipeline_stages > 1)");
  train->footer(
      "Examples: chorus train\n"
      "          chorus train examples/hetero-emulated.toml --set balance=off --steps 50\n"
      "          chorus train --set devices=cpu@1.0,cpu@0.5 --set model.kind=mlp");
  auto args = std::make_shared<TrainArgs>();
  train->add_option("config", args->config_path, "Job configuration (TOML); default: built-in job");
  train->add_option("--set", args->settings, "Override a config key: KEY=VALUE (repeatable)");
  // 0 stands for "not given"; a given 0 or negative count was silently ignored before.
  train
      ->add_option("--steps", args->steps, "Number of training steps (same as --set train.steps=N)")
      ->check(CLI::Range(std::int64_t{1}, std::numeric_limits<std::int64_t>::max()));
  train->add_option("--log-json", args->log_json, "Write one JSON object per step to FILE");
  train->add_option("--trace", args->trace,
                    "Write a timeline of the steps in --trace-steps to FILE (Chrome trace-event "
                    "JSON: Perfetto, chrome://tracing), one track per rank");
  train->add_option("--trace-steps", args->trace_steps,
                    "Steps A to B-1 that --trace records, as A:B (default 0:20)");
  train->add_option("--metrics-port", args->metrics_port,
                    "Serve Prometheus metrics (/metrics) and a live page (/) on this port while "
                    "the job runs, one per node; 0 picks a free port (logged). Default: off");
  train->add_option("--metrics-socket", args->metrics_socket, "Internal: the agent's socket")
      ->group("");  // hidden
  train->add_option("--resume", args->resume,
                    "Continue from a checkpoint: 'latest' (in checkpoint.dir), a checkpoint "
                    "directory, or a checkpoint root");
  train->add_option("--nnodes", args->nnodes, "Number of nodes (each runs chorus train)");
  train->add_option("--node-rank", args->node_rank, "This node's index in [0, nnodes)");
  train->add_option("--rdzv-endpoint", args->rdzv_endpoint,
                    "HOST:PORT where node 0 hosts the job's store (several nodes)");
  train->add_option("--secret-file", args->secret_file,
                    "File with the job secret, mode 600 (required for several nodes)");
  train->add_flag("--worker", args->worker, "Internal: run as one worker of the job")
      ->group("");  // hidden
  train->callback([&action, args, train] {
    action = [args, train] {
      if (args->worker) return runWorker(*args);
      std::vector<std::string> argv;
      if (!args->config_path.empty()) argv.push_back(args->config_path);
      for (const auto& setting : args->settings) argv.insert(argv.end(), {"--set", setting});
      if (args->steps > 0) argv.insert(argv.end(), {"--steps", std::to_string(args->steps)});
      if (!args->log_json.empty()) argv.insert(argv.end(), {"--log-json", args->log_json});
      if (!args->trace.empty())
        argv.insert(argv.end(), {"--trace", args->trace, "--trace-steps", args->trace_steps});
      return runFrontEnd(*args, argv);
    };
  });
}

}  // namespace chorus::cli
