// `chorus train --join`: this node's devices join a running elastic `chorus train` job as a new
// node (runtime::AgentOptions::join). The job — its model, data, plan and settings — is the
// running one's, read by the workers from its store; so this command line says only where the job
// is, how to prove membership, which devices to bring, and what this node's agent does.
#include <string>

#include "chorus/core/error.h"
#include "chorus/runtime/launch/agent.h"
#include "commands.h"
#include "train_command.h"

namespace chorus::cli {
namespace {

// The --set keys that mean something for a joining node; the job's others are the running job's.
constexpr const char* kDevicesKey = "devices";
constexpr const char* kMaxRestartsKey = "elastic.max_restarts";

void refuseJobOptions(const TrainArgs& args) {
  const char* why = " is the running job's; a joining node takes the job as it is";
  CHORUS_CHECK_CONFIG(args.config_path.empty(), "chorus train --join: the job file", why);
  CHORUS_CHECK_CONFIG(args.steps == 0, "chorus train --join: --steps", why);
  CHORUS_CHECK_CONFIG(args.resume.empty() && args.plan.empty(),
                      "chorus train --join: --resume and --plan are the running job's; a joining "
                      "node takes the members' state when they admit it");
  CHORUS_CHECK_CONFIG(args.trace.empty() && args.metrics_port < 0,
                      "chorus train --join: --trace and --metrics-port are not built for a "
                      "joining node");
  CHORUS_CHECK_CONFIG(args.nnodes == 1 && args.node_rank == 0 && !args.host_list.given(),
                      "chorus train --join: the node's rank comes from the running job; drop "
                      "--nnodes, --node-rank and -H");
}

int restartsOf(const std::string& value) {
  std::size_t used = 0;
  int restarts = -1;
  try {
    restarts = std::stoi(value, &used);
  } catch (const std::exception&) {
  }
  CHORUS_CHECK_CONFIG(used == value.size() && restarts >= 0,
                      "chorus train --join: ", kMaxRestartsKey,
                      " must be a whole number >= 0, got '", value, "'");
  return restarts;
}

}  // namespace

int trainJoin(const TrainArgs& args) {
  refuseJobOptions(args);
  runtime::AgentOptions agent;
  std::string devices = "auto";
  for (const std::string& setting : args.settings) {
    const std::size_t equals = setting.find('=');
    const std::string key = setting.substr(0, equals);
    CHORUS_CHECK_CONFIG(
        equals != std::string::npos && (key == kDevicesKey || key == kMaxRestartsKey),
        "chorus train --join: --set ", setting, ": only ", kDevicesKey, " and ", kMaxRestartsKey,
        " are this node's; the rest is the running job's");
    const std::string value = setting.substr(equals + 1);
    if (key == kDevicesKey)
      devices = value;
    else
      agent.max_restarts = restartsOf(value);
  }
  agent.devices = parseDeviceSpecs(devices);
  agent.join = true;
  agent.elastic = true;
  agent.rdzv_endpoint = args.rdzv_endpoint;
  agent.secret_file = args.secret_file;
  agent.secret_stdin = args.secret_stdin;
  agent.log_level = args.log_level;
  // As the launch's agents give checkpointing workers: time to finish a step and write.
  agent.grace = std::chrono::milliseconds(60000);
  agent.command = {selfExecutable(), "train", "--worker"};
  if (!args.log_json.empty())
    agent.command.insert(agent.command.end(), {"--log-json", args.log_json});
  return runtime::runAgent(agent);
}

}  // namespace chorus::cli
