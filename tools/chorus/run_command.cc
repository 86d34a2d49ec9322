// `chorus run`: start one worker per device on this node (see runtime/agent.h).
#include "chorus/runtime/launch/agent.h"
#include "chorus/runtime/launch/host_launch.h"
#include "commands.h"
#include "host_list.h"

namespace chorus::cli {
namespace {

std::string seconds(std::chrono::milliseconds duration) {
  return std::to_string(static_cast<double>(duration.count()) / 1000);
}

// -H: node `node_rank`'s `chorus run`, as the host list places it.
std::vector<std::string> remoteRun(const runtime::AgentOptions& agent,
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
  if (agent.elastic)
    command.insert(command.end(),
                   {"--elastic", "--max-restarts", std::to_string(agent.max_restarts)});
  command.push_back("--");
  command.insert(command.end(), agent.command.begin(), agent.command.end());
  return command;
}

int runOnHostList(const runtime::AgentOptions& agent, const HostListArgs& hosts) {
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
    return remoteRun(agent, devices[node_rank], nnodes, node_rank, endpoint);
  };
  return runtime::runOnHosts(launch);
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
  run->add_option("--timeout", *timeout_s, "Workers' communication deadline, seconds")
      ->check(secondsIn(kMinTimeoutSeconds, kMaxTimeoutSeconds))
      ->capture_default_str();
  run->add_option("--grace", *grace_s, "Seconds between SIGTERM and SIGKILL when stopping workers")
      ->check(secondsIn(0, 3600))
      ->capture_default_str();
  run->add_option("command", options->command, "The worker program and its arguments, after --")
      ->required();
  run->callback([&action, options, devices, timeout_s, grace_s, no_prefix, hosts, &app] {
    action = [options, devices, timeout_s, grace_s, no_prefix, hosts, &app] {
      options->devices = parseDeviceSpecs(*devices);
      options->comm_timeout = std::chrono::milliseconds(static_cast<long long>(*timeout_s * 1000));
      options->grace = std::chrono::milliseconds(static_cast<long long>(*grace_s * 1000));
      options->prefix_output = !*no_prefix;
      if (options->join) options->elastic = true;
      options->log_level = app.get_option("--log-level")->as<std::string>();
      return hosts->given() ? runOnHostList(*options, *hosts) : runtime::runAgent(*options);
    };
  });
}

}  // namespace chorus::cli
