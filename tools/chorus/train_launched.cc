// `chorus train` as one rank of a job whose processes mpirun, srun or torchrun started. No agent
// of ours runs there: each rank reads the job file itself, takes its own device from the job's
// `devices` list, joins the job (rank 0 hosts the store at CHORUS_RDZV_ENDPOINT, worker.cc), and
// the ranks all-gather their devices and nodes to build the same Plan (planOfWorld) that node 0's
// agent would have published; then each trains as an agent's worker does.
#include <fstream>
#include <iostream>

#include "chorus/chorus.h"
#include "chorus/device/discovery.h"
#include "chorus/device/host_sharing.h"
#include "chorus/runtime/checkpoint/checkpoint.h"
#include "chorus/runtime/job/job_config.h"
#include "chorus/runtime/job/job_plan.h"
#include "chorus/runtime/train/world_plan.h"
#include "commands.h"
#include "train_command.h"

namespace chorus::cli {
namespace {

// What chorus's agent does for its workers and nobody does under another launcher: refused, so
// that nothing asked for is silently left out.
void refuseAgentOptions(const TrainArgs& args, const runtime::JobConfig& job,
                        const std::string& launcher) {
  const std::string under = " (this rank was started by " + launcher + ")";
  CHORUS_CHECK_CONFIG(args.nnodes == 1 && args.node_rank == 0 && args.rdzv_endpoint.empty() &&
                          args.rdzv_backend == "tcp" && args.secret_file.empty() &&
                          !args.secret_stdin && !args.host_list.given(),
                      "chorus train: --nnodes, --node-rank, --rdzv-endpoint, --rdzv-backend, "
                      "--secret-file, --secret-stdin and -H are for "
                      "chorus's own agents; under ",
                      launcher, " the launcher numbers the ranks, ", runtime::env::kStoreEndpoint,
                      " names the store (", runtime::env::kStoreBackend, "=etcd: etcd's) and ",
                      runtime::env::kSecretFile, " the secret");
  CHORUS_CHECK_CONFIG(args.metrics_port < 0,
                      "--metrics-port: the metrics are served by chorus's "
                      "node agent, which does not run here",
                      under);
  CHORUS_CHECK_CONFIG(args.trace.empty(),
                      "--trace: the timeline's parts are merged by chorus's "
                      "node agent, which does not run here",
                      under);
  CHORUS_CHECK_CONFIG(args.plan.empty(), "--plan: a plan file runs under chorus's own agent",
                      under);
  CHORUS_CHECK_CONFIG(job.plan != "auto",
                      "config key 'plan': plan = \"auto\" measures the "
                      "devices before any worker starts, in chorus's agent",
                      under);
  CHORUS_CHECK_CONFIG(!job.elastic.enabled,
                      "config key 'elastic.enabled': elastic recovery needs "
                      "chorus's agents to report lost workers",
                      under);
}

// This rank's device: the job's `devices` list (`auto` expanded on this host) holds one device
// per rank of the job, or one per rank of this host (indexed by the local rank), or one for all.
DeviceSpec deviceOfRank(const runtime::JobConfig& job, const runtime::WorkerIdentity& identity,
                        const runtime::Environment& environment) {
  const auto found = device::discoverDevices();
  const std::vector<DeviceSpec> listed = device::expandAuto(job.devices, found);
  const auto count = static_cast<int>(listed.size());
  DeviceSpec device;
  if (count == identity.world_size)
    device = listed[identity.rank];
  else if (count == identity.local_world_size)
    device = listed[identity.local_rank];
  else if (count == 1)
    device = listed.front();
  else
    CHORUS_THROW(ConfigError, "config key 'devices': ", count, " devices (", toString(listed),
                 ") for a job of ", identity.world_size, " ranks with ", identity.local_world_size,
                 " on this host (started by ", identity.launcher,
                 "); list one device per rank, one per rank of a host, or one for all");
  device::validateSpecs({device}, found);
  const bool told =
      environment.count(runtime::env::kDevice) > 0 || environment.count(runtime::env::kDevices) > 0;
  CHORUS_CHECK_CONFIG(!told || identity.device.toString() == device.toString(), "rank ",
                      identity.rank, ": the environment names device ", identity.device.toString(),
                      " (", runtime::env::kDevice, "/", runtime::env::kDevices,
                      ") but the job's devices give it ", device.toString(),
                      "; chorus train takes the job's");
  return device;
}

}  // namespace

bool startedByOtherLauncher(const runtime::Environment& environment) {
  const std::string launcher = runtime::launcherOf(environment);
  return launcher != "none" && launcher != "chorus";
}

int trainLaunchedRank(const TrainArgs& args, runtime::Environment environment) {
  const runtime::WorkerIdentity identity = runtime::identityFromEnvironment(environment);
  const runtime::JobConfig job = runtime::readJobConfig(loadConfig(args));
  refuseAgentOptions(args, job, identity.launcher);
  // Rank 0 writes the log: a path it cannot write is refused before the job starts, and the log
  // of an earlier run is replaced, not appended to, as under chorus's agent.
  if (identity.rank == 0 && !args.log_json.empty() &&
      !std::ofstream(args.log_json, std::ios::trunc))
    CHORUS_THROW(ConfigError, "--log-json: cannot write ", args.log_json);
  const DeviceSpec device = deviceOfRank(job, identity, environment);
  environment[runtime::env::kDevice] = device.toString();
  // cpu_threads as asked; "auto" is one thread here, since the launcher, not chorus, decides what
  // shares the host's cores.
  if (job.cpu_threads > 0) {
    const int threads =
        device::intraOpThreads({device}, /*cores=*/1, static_cast<int>(job.cpu_threads)).front();
    if (threads > 1) environment[runtime::env::kCpuThreads] = std::to_string(threads);
  }
  runtime::InitOptions init;
  init.environment = std::move(environment);
  auto worker = chorus::init(init);
  catchStopSignals();
  // Every rank builds the same plan from the same job and the gathered devices: a job that does
  // not fit them is refused by all together.
  const runtime::JobPackage package{job, runtime::planOfWorld(job, *worker)};
  if (worker->rank() == 0)
    std::cout << "chorus train: " << identity.world_size << " ranks started by "
              << identity.launcher << "; plan: " << runtime::describePlan(package.plan)
              << std::endl;
  TrainArgs rank_args = args;
  if (!args.resume.empty()) {
    rank_args.resume = runtime::resolveCheckpoint(args.resume, job.checkpoint.dir);
    runtime::validateResume(job, rank_args.resume);
  }
  return trainWorker(rank_args, package, worker, FaultInjection::fromEnvironment());
}

}  // namespace chorus::cli
