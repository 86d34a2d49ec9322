// `chorus run`: start one worker per device on this node (see runtime/agent.h). With
// --metrics-port and --trace the node's agent also observes a user's program: its workers report
// each step and record their timeline through the library they train with (the Python front:
// python/src/step_observer.h), to the same node monitor and in the same trace format as
// `chorus train`'s (observe/run_observe.h says how the request reaches them).
#include <unistd.h>

#include <iostream>

#include "chorus/observe/metrics_server.h"
#include "chorus/observe/node_monitor.h"
#include "chorus/observe/run_observe.h"
#include "chorus/runtime/launch/agent.h"
#include "chorus/runtime/launch/host_launch.h"
#include "chorus/runtime/launch/identity.h"
#include "commands.h"
#include "host_list.h"

namespace chorus::cli {
namespace {

// What `chorus run` was asked to observe. Value type.
struct RunObserveArgs {
  int metrics_port = -1;  // -1: no metrics; 0: a free port (logged)
  std::string trace;      // "": no timeline
  std::string trace_steps = "0:20";

  // The same options for another node's `chorus run` (-H).
  std::vector<std::string> forwarded() const;
};

std::vector<std::string> RunObserveArgs::forwarded() const {
  std::vector<std::string> options;
  if (metrics_port >= 0)
    options.insert(options.end(), {"--metrics-port", std::to_string(metrics_port)});
  if (!trace.empty())
    options.insert(options.end(), {"--trace", trace, "--trace-steps", trace_steps});
  return options;
}

// --metrics-port and --trace, before any worker starts: checks the trace's path and steps (an
// earlier run's parts removed), listens on the metrics port and logs where, and puts the request
// into the workers' environment (observe/run_observe.h). Returns the running monitor, or null
// without --metrics-port. Throws ConfigError when the port cannot be used (busy, privileged) or
// the trace not written.
std::unique_ptr<observe::NodeMonitor> startRunObservation(const RunObserveArgs& args,
                                                          runtime::AgentOptions& agent) {
  // The variables a user sets for a job without an agent (mpirun, srun: run_observe.h) would
  // reach the workers, where nobody serves or merges them: the options say it here.
  const runtime::Environment environment = runtime::processEnvironment();
  for (const char* name : {observe::kMetricsPortVariable, observe::kTraceVariable,
                           observe::kTraceStepsVariable, observe::kMetricsSocketVariable}) {
    const auto found = environment.find(name);
    CHORUS_CHECK_CONFIG(found == environment.end() || found->second.empty(), name, "=",
                        found->second,
                        " is set in chorus run's environment, for a job that another launcher "
                        "starts; chorus run's agent serves and merges what --metrics-port, "
                        "--trace and --trace-steps ask: give those instead, and unset it");
  }
  observe::ObserveRequest request;
  if (!args.trace.empty()) {
    request.trace = args.trace;
    request.trace_steps = observe::parseTraceSteps(args.trace_steps);
    // A path that cannot be written fails now, not once the workers are done.
    observe::checkTraceWritable(args.trace);
    observe::removeTraceParts(args.trace);
  }
  std::unique_ptr<observe::NodeMonitor> monitor;
  if (args.metrics_port >= 0) {
    // Listening before any worker starts: a busy or privileged port is refused at once.
    observe::checkMetricsPort(args.metrics_port, static_cast<unsigned>(::geteuid()));
    observe::NodeMonitorOptions options;
    options.node = agent.node_rank;
    options.port = args.metrics_port;
    monitor = std::make_unique<observe::NodeMonitor>(options);
    char host[256] = "localhost";
    ::gethostname(host, sizeof host - 1);
    std::cout << "chorus run: metrics on http://" << host << ":" << monitor->port()
              << "/metrics, live page on http://" << host << ":" << monitor->port() << "/"
              << std::endl;
    request.metrics_socket = monitor->socketPath();
  }
  for (const auto& [name, value] : observe::observeEnvironment(request))
    agent.worker_environment[name] = value;
  return monitor;
}

// After the workers ended: merges the parts of the trace that this node's workers wrote.
void finishRunObservation(const RunObserveArgs& args) {
  if (args.trace.empty()) return;
  const int merged = observe::mergeTraceOf(args.trace);
  if (merged > 0)
    std::cout << "chorus run: wrote the timeline of " << merged << " ranks to " << args.trace
              << std::endl;
  else
    std::cout << "chorus run: no worker recorded a step for " << args.trace
              << " (the timeline comes from chorus.DataParallel and chorus.step)" << std::endl;
}

std::string seconds(std::chrono::milliseconds duration) {
  return std::to_string(static_cast<double>(duration.count()) / 1000);
}

// -H: node `node_rank`'s `chorus run`, as the host list places it.
std::vector<std::string> remoteRun(const runtime::AgentOptions& agent,
                                   const RunObserveArgs& observe,
                                   const std::vector<DeviceSpec>& devices, int nnodes,
                                   int node_rank, const std::string& endpoint) {
  std::vector<std::string> command{selfExecutable(),
                                   "--log-level",
                                   agent.log_level,
                                   "run",
                                   "--devices",
                                   toString(devices),
                                   "--nnodes",
                                   std::to_string(nnodes),
                                   "--node-rank",
                                   std::to_string(node_rank),
                                   "--rdzv-endpoint",
                                   endpoint,
                                   "--secret-stdin",
                                   "--timeout",
                                   seconds(agent.comm_timeout),
                                   "--grace",
                                   seconds(agent.grace)};
  if (!agent.log_dir.empty()) command.insert(command.end(), {"--log-dir", agent.log_dir});
  if (!agent.prefix_output) command.push_back("--no-prefix");
  // Each node serves its own workers' metrics and merges their trace on its own file system.
  const std::vector<std::string> observed = observe.forwarded();
  command.insert(command.end(), observed.begin(), observed.end());
  if (agent.elastic)
    command.insert(command.end(),
                   {"--elastic", "--max-restarts", std::to_string(agent.max_restarts)});
  command.push_back("--");
  command.insert(command.end(), agent.command.begin(), agent.command.end());
  return command;
}

int runOnHostList(const runtime::AgentOptions& agent, const RunObserveArgs& observe,
                  const HostListArgs& hosts) {
  refuseWithHostList(agent.nnodes, agent.node_rank, agent.secret_file, agent.secret_stdin);
  CHORUS_CHECK_CONFIG(!agent.join,
                      "-H starts a whole job and --join adds a node to a running "
                      "one: give one of them");
  CHORUS_CHECK_CONFIG(agent.rdzv_backend == "tcp",
                      "-H with --rdzv-backend etcd is not built: start each node's `chorus run "
                      "--rdzv-backend etcd` yourself");
  runtime::HostLaunchOptions launch = hostLaunchOptions(hosts, agent.rdzv_endpoint);
  const auto devices = runtime::devicesPerHost(launch.hosts, agent.devices);
  const int nnodes = static_cast<int>(launch.hosts.size());
  launch.elastic = agent.elastic;
  launch.grace = agent.grace + std::chrono::seconds(10);
  launch.node_command = [&](int node_rank, const std::string& endpoint) {
    return remoteRun(agent, observe, devices[node_rank], nnodes, node_rank, endpoint);
  };
  return runtime::runOnHosts(launch);
}

// This node's agent, with what --metrics-port and --trace ask of its workers.
int runHere(runtime::AgentOptions& agent, const RunObserveArgs& observe) {
  const std::unique_ptr<observe::NodeMonitor> monitor = startRunObservation(observe, agent);
  const int code = runtime::runAgent(agent);
  finishRunObservation(observe);
  return code;
}

}  // namespace

void addRunCommand(CLI::App& app, Action& action) {
  auto* run = app.add_subcommand(
      "run", "Start one worker per device on this node and supervise them (like torchrun)");
  run->footer(
      "Example: chorus run --devices cpu@1.0,cpu@0.5 -- ./my_trainer --epochs 3\n"
      "Several nodes: chorus run --devices cuda:0,cuda:1 --nnodes 2 --node-rank 0 \\\n"
      "                 --rdzv-endpoint 10.0.0.1:29500 --secret-file job.secret -- ./trainer\n"
      "Over ssh:      chorus run -H gpu0:2,gpu1:1 --devices cuda:0,cuda:1,cuda:0 -- ./trainer\n"
      "A new node:    chorus run --join --rdzv-endpoint 10.0.0.1:29500 --secret-file job.secret "
      "\\\n"
      "                 --devices cuda:0 -- chorus train --worker");
  auto options = std::make_shared<runtime::AgentOptions>();
  auto devices = std::make_shared<std::string>("auto");
  auto timeout_s = std::make_shared<double>(60.0);
  auto grace_s = std::make_shared<double>(3.0);
  auto no_prefix = std::make_shared<bool>(false);
  auto hosts = std::make_shared<HostListArgs>();
  auto observe = std::make_shared<RunObserveArgs>();
  run->add_option("--devices", *devices,
                  "Device specs, comma-separated: auto, cpu, cpu@0.5, cpu@0.5/512MiB, cuda:0, "
                  "cuda:1/20GiB")
      ->capture_default_str();
  run->add_option("--nnodes", options->nnodes, "Number of nodes")->capture_default_str();
  run->add_option("--node-rank", options->node_rank, "This node's index")->capture_default_str();
  run->add_option("--rdzv-endpoint", options->rdzv_endpoint,
                  "HOST:PORT where node 0 hosts the job's store (default: 127.0.0.1, free port); "
                  "with --rdzv-backend etcd, etcd's HOST:PORT[,HOST:PORT...]");
  run->add_option("--rdzv-backend", options->rdzv_backend,
                  "Where the job's store lives: tcp (node 0's agent hosts it) or etcd (every node "
                  "is a client of the etcd at --rdzv-endpoint, so an elastic job outlives node 0)")
      ->check(CLI::IsMember({"tcp", "etcd"}))
      ->capture_default_str();
  run->add_option("--secret-file", options->secret_file,
                  "File with the job secret, mode 600 (default: a fresh secret; required for "
                  "several nodes)");
  run->add_flag("--secret-stdin", options->secret_stdin,
                "Read the job secret from the first line of standard input, and stop this node "
                "when standard input ends (how -H starts nodes over ssh)");
  addHostListOptions(*run, *hosts);
  run->add_option("--log-dir", options->log_dir, "Also write each rank's output to DIR/rank-N.log");
  run->add_flag("--no-prefix", *no_prefix, "Do not prefix output lines with [rank N]");
  run->add_flag("--elastic", options->elastic,
                "Elastic job: a failed worker does not stop the others; the agent posts its loss "
                "to the job's store (elastic/exited/RANK) and the survivors go on");
  run->add_flag("--join", options->join,
                "Join the running elastic job whose store is at --rdzv-endpoint (with its "
                "--secret-file) as a new node: its workers take shares at a step boundary. "
                "Implies --elastic");
  run->add_option("--max-restarts", options->max_restarts,
                  "Needs --elastic: start a replacement for a failed worker, at most N times on "
                  "this node, under a new rank (CHORUS_RANK) that names the one it replaces in "
                  "CHORUS_ELASTIC_REPLACES")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  run->add_option(
      "--metrics-port", observe->metrics_port,
      "Serve Prometheus metrics (/metrics) and a live page (/) of the workers' steps on "
      "this port while they run, as chorus train does (chorus.DataParallel and "
      "chorus.step report them); 0 picks a free port (logged). Default: off");
  run->add_option("--trace", observe->trace,
                  "Write a timeline of the steps in --trace-steps to FILE (Chrome trace-event "
                  "JSON: Perfetto, chrome://tracing), one track per rank, as chorus train does");
  CLI::Option* trace_steps =
      run->add_option("--trace-steps", observe->trace_steps,
                      "Steps A to B-1 that --trace records, as A:B (default 0:20)");
  run->add_option("--timeout", *timeout_s, "Workers' communication deadline, seconds")
      ->check(secondsIn(kMinTimeoutSeconds, kMaxTimeoutSeconds))
      ->capture_default_str();
  run->add_option("--grace", *grace_s, "Seconds between SIGTERM and SIGKILL when stopping workers")
      ->check(secondsIn(0, 3600))
      ->capture_default_str();
  run->add_option("command", options->command, "The worker program and its arguments, after --")
      ->required();
  run->callback([&action, options, devices, timeout_s, grace_s, no_prefix, hosts, observe,
                 trace_steps, &app] {
    action = [options, devices, timeout_s, grace_s, no_prefix, hosts, observe, trace_steps, &app] {
      options->devices = parseDeviceSpecs(*devices);
      options->comm_timeout = std::chrono::milliseconds(static_cast<long long>(*timeout_s * 1000));
      options->grace = std::chrono::milliseconds(static_cast<long long>(*grace_s * 1000));
      options->prefix_output = !*no_prefix;
      if (options->join) options->elastic = true;
      options->log_level = app.get_option("--log-level")->as<std::string>();
      CHORUS_CHECK_CONFIG(!observe->trace.empty() || trace_steps->count() == 0,
                          "--trace-steps needs --trace");
      return hosts->given() ? runOnHostList(*options, *observe, *hosts)
                            : runHere(*options, *observe);
    };
  });
}

}  // namespace chorus::cli
