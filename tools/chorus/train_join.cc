// `chorus train --join`: this node's devices join a running elastic `chorus train` job as a new
// node (runtime::AgentOptions::join). The job — its model, data, plan and settings — is the
// running one's, read by the workers from its store; so this command line says only where the job
// is, how to prove membership, which devices to bring, and what this node's agent does.
#include <cstdint>
#include <limits>
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

}  // namespace

int trainJoin(const TrainArgs& args) {
  refuseJobOptions(args);
  for (const std::string& setting : args.settings) {
    const std::string key = setting.substr(0, setting.find('='));
    CHORUS_CHECK_CONFIG(key == kDevicesKey || key == kMaxRestartsKey, "chorus train --join: --set ",
                        setting, ": only ", kDevicesKey, " and ", kMaxRestartsKey,
                        " are this node's; the rest is the running job's");
  }
  // Those keys alone, parsed as a job file's are (not the built-in job, whose devices are not
  // this node's).
  Config config = Config::parseString("", "--set");
  for (const std::string& setting : args.settings) config.set(setting);
  const std::int64_t restarts = config.getInt(kMaxRestartsKey, 0);
  CHORUS_CHECK_CONFIG(restarts >= 0 && restarts <= std::numeric_limits<int>::max(),
                      "chorus train --join: ", kMaxRestartsKey, " must be 0 to ",
                      std::numeric_limits<int>::max(), ", got ", restarts);
  runtime::AgentOptions agent;
  agent.max_restarts = static_cast<int>(restarts);
  agent.devices = parseDeviceSpecs(config.getString(kDevicesKey, "auto"));
  agent.join = true;
  agent.elastic = true;
  agent.rdzv_endpoint = args.rdzv_endpoint;
  agent.rdzv_backend = args.rdzv_backend;
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
