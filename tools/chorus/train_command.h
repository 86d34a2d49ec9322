// `chorus train`'s parts shared by its two ways to start: as the node agent that starts its workers
// (train_command.cc, under `chorus run`'s machinery) and as one rank of a job whose processes
// mpirun, srun or torchrun started (train_launched.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chorus/core/config.h"
#include "chorus/runtime/job/job_package.h"
#include "chorus/runtime/launch/worker.h"
#include "fault_injection.h"
#include "host_list.h"

namespace chorus::cli {

// `chorus train`'s command line, as parsed. Value type.
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
  // A plan file (`chorus plan --out`) to run as it is.
  std::string plan;
  bool worker = false;
  // Several nodes (as `chorus run`): every node runs `chorus train` with the same config.
  int nnodes = 1;
  int node_rank = 0;
  std::string rdzv_endpoint;
  // Where the job's store lives: "tcp" or "etcd" (runtime::AgentOptions::rdzv_backend).
  std::string rdzv_backend = "tcp";
  std::string secret_file;
  // The secret on standard input's first line, and stop when it ends (AgentOptions::secret_stdin).
  bool secret_stdin = false;
  // Join the running elastic job at rdzv_endpoint as a new node (train_join.cc).
  bool join = false;
  // -H: start the job's nodes over ssh (host_launch.h).
  HostListArgs host_list;
  std::string log_level = "info";  // chorus --log-level, passed on to the nodes of -H
};

// The job as written: the file (or the built-in default), then --set and --steps.
Config loadConfig(const TrainArgs& args);

// A worker stops at the next step boundary on SIGTERM/SIGINT, every rank agreeing, and writes a
// checkpoint when the job has a checkpoint directory.
void catchStopSignals();

// Runs the package's plan on this worker to the end; rank 0 prints progress and writes --log-json.
int trainWorker(const TrainArgs& args, const runtime::JobPackage& package,
                std::shared_ptr<runtime::Worker> worker, const FaultInjection& fault);

// Whether `environment` says the process was started as one rank of a job by mpirun, srun or
// torchrun (their variables are set and chorus run's are not): then it trains as that rank,
// without an agent.
bool startedByOtherLauncher(const runtime::Environment& environment);

// `chorus train` as one rank of a job that mpirun, srun or torchrun started (train_launched.cc),
// `environment` being the process's.
int trainLaunchedRank(const TrainArgs& args, runtime::Environment environment);

// `chorus train -H HOSTS`: the job's nodes started over ssh, one per host (train_hosts.cc).
int trainOnHostList(const TrainArgs& args);

// `chorus train --join`: this node's devices join the running elastic job whose store is at
// --rdzv-endpoint (train_join.cc).
int trainJoin(const TrainArgs& args);

}  // namespace chorus::cli
