// `chorus train -H HOSTS`: every node's `chorus train` started over ssh (runtime/launch/
// host_launch.h), the job's `devices` split over the hosts by their slots.
#include "chorus/runtime/job/job_config.h"
#include "chorus/runtime/launch/host_launch.h"
#include "commands.h"
#include "train_command.h"

namespace chorus::cli {
namespace {

// -H: node `node_rank`'s `chorus train`, on its share of the job's devices.
std::vector<std::string> remoteTrain(const TrainArgs& args, const std::vector<DeviceSpec>& devices,
                                     int nnodes, int node_rank, const std::string& endpoint) {
  std::vector<std::string> command{selfExecutable(), "--log-level", args.log_level, "train"};
  if (!args.config_path.empty()) command.push_back(args.config_path);
  for (const std::string& setting : args.settings)
    command.insert(command.end(), {"--set", setting});
  command.insert(command.end(), {"--set", "devices=" + toString(devices)});
  const auto option = [&command](const char* name, const std::string& value) {
    if (!value.empty()) command.insert(command.end(), {name, value});
  };
  option("--steps", args.steps > 0 ? std::to_string(args.steps) : "");
  option("--log-json", args.log_json);
  option("--trace", args.trace);
  if (!args.trace.empty()) option("--trace-steps", args.trace_steps);
  option("--metrics-port", args.metrics_port >= 0 ? std::to_string(args.metrics_port) : "");
  option("--resume", args.resume);
  option("--plan", args.plan);  // refused there with the reason, as with --nnodes by hand
  command.insert(command.end(),
                 {"--nnodes", std::to_string(nnodes), "--node-rank", std::to_string(node_rank),
                  "--rdzv-endpoint", endpoint, "--secret-stdin"});
  return command;
}

}  // namespace

int trainOnHostList(const TrainArgs& args) {
  refuseWithHostList(args.nnodes, args.node_rank, args.secret_file, args.secret_stdin);
  CHORUS_CHECK_CONFIG(args.rdzv_backend == "tcp",
                      "-H with --rdzv-backend etcd is not built: start each node's `chorus train "
                      "--rdzv-backend etcd` yourself");
  const runtime::JobConfig job = runtime::readJobConfig(loadConfig(args));
  runtime::HostLaunchOptions launch = hostLaunchOptions(args.host_list, args.rdzv_endpoint);
  const auto devices = runtime::devicesPerHost(launch.hosts, job.devices);
  const int nnodes = static_cast<int>(launch.hosts.size());
  launch.elastic = job.elastic.enabled;
  // More than the nodes' agents give their workers (runFrontEnd) to stop and checkpoint.
  launch.grace =
      std::chrono::seconds(job.checkpoint.dir.empty() ? 3 : 60) + std::chrono::seconds(10);
  launch.node_command = [&](int node_rank, const std::string& endpoint) {
    return remoteTrain(args, devices[node_rank], nnodes, node_rank, endpoint);
  };
  return runtime::runOnHosts(launch);
}

}  // namespace chorus::cli
