// `chorus train`: the built-in trainer. The front end reads the job once, finds the devices
// once, settles the plan (the job's keys as written, the planner's with plan = "auto", or a plan
// file with --plan), validates it, and becomes the node agent; once every node has joined, node 0
// builds the Plan on all the job's devices, logs it and puts the job and the Plan in the job's
// store (runtime/job_package.h). Each worker (`--worker`) reads them from there and runs the
// Plan with the Trainer, the one executor for every plan. Rank 0 prints progress and writes
// --log-json.
#include <signal.h>
#include <unistd.h>

#include <csignal>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>

#include <c10/util/Exception.h>

#include "chorus/chorus.h"
#include "chorus/core/config.h"
#include "chorus/core/error.h"
#include "chorus/core/units.h"
#include "chorus/device/discovery.h"
#include "chorus/observe/trace_recorder.h"
#include "chorus/plan/plan_json.h"
#include "chorus/runtime/checkpoint/checkpoint.h"
#include "chorus/runtime/job/auto_plan.h"
#include "chorus/runtime/job/job_config.h"
#include "chorus/runtime/job/job_package.h"
#include "chorus/runtime/job/job_plan.h"
#include "chorus/runtime/job/pipeline_job.h"
#include "chorus/runtime/launch/agent.h"
#include "chorus/runtime/train/trainer.h"
#include "commands.h"
#include "fault_injection.h"
#include "host_list.h"
#include "train_command.h"
#include "train_metrics.h"
#include "train_report.h"

namespace chorus::cli {
namespace {

// Set by SIGTERM/SIGINT in a worker: the trainer polls it once per step, every rank agrees to
// stop, writes a checkpoint and returns. A signal handler can reach nothing but a global.
volatile std::sig_atomic_t g_stop_requested = 0;

void requestStop(int) { g_stop_requested = 1; }

}  // namespace

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

namespace {

// What the front end settles before any worker starts. Value type.
struct SettledJob {
  runtime::JobConfig job;
  std::vector<device::DeviceInfo> found;  // this host's devices, discovered once
  std::vector<DeviceSpec> devices;        // this node's, in rank order
  // The plan when the front end settled it (a plan file, or the planner's); else node 0 builds it
  // from the job's keys on every node's devices (runtime::planOfJob).
  std::optional<plan::Plan> plan;
  // A pipeline of several nodes: its layout is checked on every node's devices by node 0, once
  // they joined (each node's `devices` are its own share of the ranks).
  bool check_pipeline_on_join = false;

  bool pipeline() const { return plan ? plan->stageCount() > 1 : job.parallel.pipeline_stages > 1; }
};

// A plan made elsewhere, adopted as it is: the job's devices in the plan's rank order, the job
// under the plan (its ZeRO stage), all checked (runtime::adoptPlan).
void adoptPlan(const plan::Plan& plan, SettledJob& settled) {
  runtime::AdoptedPlan adopted = runtime::adoptPlan(plan, settled.job, settled.devices);
  settled.job = std::move(adopted.job);
  settled.devices = std::move(adopted.devices);
  settled.plan = std::move(adopted.plan);
}

// plan = "auto": measures the job's devices, times its model on this host's CPU, plans, prints
// the choice in one line and runs the planner's Plan as it is, prediction included.
void applyAutoPlan(const TrainArgs& args, SettledJob& settled) {
  CHORUS_CHECK_CONFIG(args.nnodes == 1,
                      "config key 'plan': plan = \"auto\" plans one node's devices; with --nnodes "
                      "> 1 set [parallel] or balancer.shares by hand (plan = \"manual\")");
  const std::vector<int> threads = runtime::jobThreads(settled.job, settled.devices, settled.found);
  const std::vector<plan::MeasuredDevice> measured =
      runtime::measureJobDevices(settled.devices, settled.found, threads);
  const runtime::PlannedJob planned = runtime::planJob(
      settled.job, settled.devices, measured,
      runtime::autoPlanCalibration(settled.job, settled.devices, measured, threads));
  std::cout << "chorus train: " << planned.summary << std::endl;
  adoptPlan(planned.plan, settled);
}

// --plan FILE: the plan as it is, its ranks on the job's devices (in the plan's order).
void applyPlanFile(const TrainArgs& args, const Config& config, SettledJob& settled) {
  CHORUS_CHECK_CONFIG(args.nnodes == 1, "--plan: a plan file runs on one node (--nnodes 1)");
  CHORUS_CHECK_CONFIG(
      settled.job.plan != "auto",
      "--plan: the job says plan = \"auto\"; run either the planner or a plan file");
  // What the plan decides must not be set twice; the checkpointing mode stays the job's choice.
  for (const std::string& key : runtime::autoPlanKeys())
    CHORUS_CHECK_CONFIG(key == "parallel.activation_checkpointing" || !config.has(key),
                        "config key '", key, "': --plan ", args.plan,
                        " decides it; remove the key or the --plan");
  const std::vector<DeviceSpec> listed = settled.devices;
  adoptPlan(plan::loadPlanFile(args.plan), settled);
  // A planner may leave a device out (one that would only slow the step): say so.
  if (settled.devices.size() < listed.size())
    std::cout << "chorus train: --plan " << args.plan << " runs " << settled.devices.size()
              << " of the job's " << listed.size() << " devices (" << toString(listed) << ")"
              << std::endl;
}

// Reads the job (the only time its file is read), finds the devices (the only discovery) and
// settles the plan where the front end can; then checks the job against this node's devices.
SettledJob settleJob(const TrainArgs& args) {
  const Config config = loadConfig(args);
  SettledJob settled;
  settled.job = runtime::readJobConfig(config);
  settled.found = device::discoverDevices();
  settled.devices = device::expandAuto(settled.job.devices, settled.found);
  device::validateSpecs(settled.devices, settled.found);
  if (!args.plan.empty())
    applyPlanFile(args, config, settled);
  else if (settled.job.plan == "auto")
    applyAutoPlan(args, settled);
  if (settled.pipeline() && !settled.plan && args.nnodes == 1) {
    runtime::validatePipelineJob(settled.job, settled.devices);
  } else {
    settled.check_pipeline_on_join = settled.pipeline() && !settled.plan;
    // A pipeline's budgets bound its stages, not the whole model: the planner's cut was checked
    // against them (planOfJob), a plan file's cut is run as it is.
    std::vector<DeviceSpec> devices = settled.devices;
    if (settled.pipeline())
      for (auto& device : devices) device.memory_budget.reset();
    runtime::validateJobOnDevices(settled.job, devices);
  }
  return settled;
}

// Node 0, once every node joined: the plan on all the job's devices, logged and packed for the
// workers. A settled plan was checked against the job when it was settled (one node: the same
// devices); one built here fits by construction.
std::string prepareJob(const SettledJob& settled, const std::vector<DeviceSpec>& devices,
                       const std::vector<int>& node_of_rank) {
  std::vector<std::string> nodes;
  for (const int node : node_of_rank) nodes.push_back("node" + std::to_string(node));
  if (settled.check_pipeline_on_join) runtime::validatePipelineJob(settled.job, devices);
  // Unlike devices (a GPU beside a CPU) start from shares by their measured speeds.
  const plan::Plan plan =
      settled.plan ? *settled.plan
                   : runtime::planOfJob(settled.job, devices, nodes,
                                        runtime::measureStartRates(settled.job, devices));
  std::cout << "chorus train: plan: " << runtime::describePlan(plan) << std::endl;
  return runtime::encodeJobPackage(settled.job, plan);
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

// --trace: a path that cannot be written fails now, not after training.
void checkTraceRequest(const TrainArgs& args, const SettledJob& settled) {
  if (args.trace.empty()) return;
  observe::parseTraceSteps(args.trace_steps);
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

int runFrontEnd(const TrainArgs& args) {
  const SettledJob settled = settleJob(args);
  const runtime::JobConfig& job = settled.job;
  checkTraceRequest(args, settled);
  // Listening now: a busy or privileged port is refused before anything else starts.
  std::unique_ptr<observe::NodeMonitor> monitor;
  if (args.metrics_port >= 0) monitor = startTrainMonitor(args.metrics_port, args.node_rank);
  // Rank 0 writes the log once the workers run; a path it cannot write is better refused now
  // than as a worker's failure after the job started.
  if (!args.log_json.empty() && !std::ofstream(args.log_json, std::ios::trunc))
    CHORUS_THROW(ConfigError, "--log-json: cannot write ", args.log_json);
  runtime::AgentOptions agent;
  agent.devices = settled.devices;
  agent.discovered = settled.found;
  agent.cpu_transport = job.comm.cpu_transport;
  agent.cpu_threads = static_cast<int>(job.cpu_threads);
  // A lost worker is the survivors' to recover from (docs/elastic.md), not a reason to stop.
  agent.elastic = job.elastic.enabled;
  agent.max_restarts = static_cast<int>(job.elastic.max_restarts);
  agent.nnodes = args.nnodes;
  agent.node_rank = args.node_rank;
  agent.rdzv_endpoint = args.rdzv_endpoint;
  agent.rdzv_backend = args.rdzv_backend;
  agent.secret_file = args.secret_file;
  agent.secret_stdin = args.secret_stdin;
  agent.comm_timeout = std::chrono::milliseconds(static_cast<long long>(job.comm.timeout_s * 1000));
  // Checkpointing workers finish their step and write a checkpoint when stopped: give them time.
  if (!job.checkpoint.dir.empty()) agent.grace = std::chrono::milliseconds(60000);
  agent.prepare_job = [&settled](const std::vector<DeviceSpec>& devices,
                                 const std::vector<int>& node_of_rank) {
    return prepareJob(settled, devices, node_of_rank);
  };
  // Workers get the job and the plan from the store; their command line says only what to do
  // with them.
  agent.command = {selfExecutable(), "train", "--worker"};
  if (!args.log_json.empty())
    agent.command.insert(agent.command.end(), {"--log-json", args.log_json});
  if (!args.trace.empty())
    agent.command.insert(agent.command.end(),
                         {"--trace", args.trace, "--trace-steps", args.trace_steps});
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
  const int code = runtime::runAgent(agent);
  if (!args.trace.empty()) mergeTrace(args.trace);
  return code;
}

int runTrainer(const TrainArgs& args, const runtime::JobPackage& package,
               std::shared_ptr<runtime::Worker> worker, const FaultInjection& fault) {
  const runtime::JobConfig& job = package.job;
  // A replacement joins the running job while its Trainer is built: the "join" point is before.
  if (worker->identity().joins())
    if (auto at_point = fault.hook(worker->member())) at_point(0, "join");
  runtime::Trainer trainer(job, package.plan, worker);
  // A replacement worker took the members' state when it joined: the checkpoint the job started
  // from is long behind.
  if (!args.resume.empty() && !worker->identity().joins()) trainer.resume(args.resume);
  // Rank 0 writes; under elastic recovery, only while its generation is the job's (a stopped
  // and continued worker must not write over its successors' log).
  TrainReport report(
      job, package.plan,
      [&worker, &trainer] { return worker->rank() == 0 && !trainer.superseded(); }, args.log_json);
  runtime::TrainerHooks hooks;
  hooks.at_point = fault.hook(worker->member());
  std::unique_ptr<TrainMetrics> metrics;
  if (!args.metrics_socket.empty())
    metrics = std::make_unique<TrainMetrics>(args.metrics_socket, worker, job.train.global_batch);
  hooks.on_recovery = [&](const runtime::RecoveryRecord& record) {
    report.recovery(record);
    if (metrics) metrics->recovery(record);
  };
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

}  // namespace

int trainWorker(const TrainArgs& args, const runtime::JobPackage& package,
                std::shared_ptr<runtime::Worker> worker, const FaultInjection& fault) {
  try {
    return runTrainer(args, package, worker, fault);
  } catch (const c10::OutOfMemoryError& error) {
    // libtorch names the GPU by its index and the cap by a fraction: say which device of the job
    // it was, and under which budget (cuda:1/20GiB caps the caching allocator at 20 GiB).
    const DeviceSpec& device = worker->identity().device;
    if (device.kind != DeviceKind::kCuda) throw;
    CHORUS_THROW(OutOfMemoryError, device.toString(), " ran out of memory",
                 device.memory_budget
                     ? " under its memory budget of " + formatBytes(*device.memory_budget)
                     : std::string(),
                 ": ", error.what_without_backtrace());
  }
}

namespace {

int runWorker(const TrainArgs& args) {
  auto worker = chorus::init();
  catchStopSignals();
  const FaultInjection fault = FaultInjection::fromEnvironment();
  const runtime::JobPackage package = runtime::fetchJobPackage(
      *worker->store(), std::chrono::milliseconds(worker->identity().timeout_ms));
  return trainWorker(args, package, worker, fault);
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
  train->add_option("--plan", args->plan,
                    "Run this plan (JSON, as `chorus plan --out` writes it) on the job's devices");
  train->add_option("--nnodes", args->nnodes, "Number of nodes (each runs chorus train)");
  train->add_option("--node-rank", args->node_rank, "This node's index in [0, nnodes)");
  train->add_option("--rdzv-endpoint", args->rdzv_endpoint,
                    "HOST:PORT where node 0 hosts the job's store (several nodes); with "
                    "--rdzv-backend etcd, etcd's HOST:PORT[,HOST:PORT...]");
  train
      ->add_option("--rdzv-backend", args->rdzv_backend,
                   "Where the job's store lives: tcp (node 0's agent hosts it) or etcd (every "
                   "node is a client of the etcd at --rdzv-endpoint, so an elastic job outlives "
                   "node 0)")
      ->check(CLI::IsMember({"tcp", "etcd"}))
      ->capture_default_str();
  train->add_option("--secret-file", args->secret_file,
                    "File with the job secret, mode 600 (required for several nodes)");
  train->add_flag("--secret-stdin", args->secret_stdin,
                  "Read the job secret from the first line of standard input, and stop this node "
                  "when standard input ends (how -H starts nodes over ssh)");
  train->add_flag("--join", args->join,
                  "Join the running elastic job whose store is at --rdzv-endpoint (its "
                  "--secret-file) with this node's devices (--set devices=...): they take shares "
                  "at a step boundary; the job's config comes from the job");
  addHostListOptions(*train, args->host_list);
  train->add_flag("--worker", args->worker, "Internal: run as one worker of the job")
      ->group("");  // hidden
  train->callback([&action, args, &app] {
    action = [args, &app] {
      if (args->worker) return runWorker(*args);
      runtime::Environment environment = runtime::processEnvironment();
      if (startedByOtherLauncher(environment))
        return trainLaunchedRank(*args, std::move(environment));
      args->log_level = app.get_option("--log-level")->as<std::string>();
      if (args->join) return trainJoin(*args);
      return args->host_list.given() ? trainOnHostList(*args) : runFrontEnd(*args);
    };
  });
}

}  // namespace chorus::cli
