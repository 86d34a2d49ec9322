// Starting a job's nodes on a list of hosts over ssh, as `horovodrun -H` and `mpirun -H` do.
//
// `chorus run -H a:2,b:1 --devices ... -- PROGRAM` (and `chorus train -H ...`) runs, for each host
// in order, `ssh HOST 'cd DIR && exec chorus run --nnodes N --node-rank I --rdzv-endpoint
// FIRST:PORT --secret-stdin ...'` and supervises those ssh processes: node I's agent starts that
// host's workers, node 0's hosts the job's store, and the agents meet and number the ranks as
// with --nnodes by hand (agent.h). The job secret is generated here and written on each ssh's
// standard input, never on a command line (which `ps` shows to every user of either machine), and
// that input stays open while the job runs: its end, when this launcher stops (Ctrl-C) or a
// connection is lost, stops the far node (AgentOptions::secret_stdin). The remote hosts need the
// same chorus at the same path and the same working directory (a shared or identical file tree,
// as mpirun assumes), and ssh that logs in without a password (BatchMode).
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "chorus/core/device_spec.h"

namespace chorus::runtime {

// One entry of a host list. Value type.
struct HostSlots {
  std::string host;  // a name or address ssh reaches, and the other hosts too (the store's)
  int slots = 1;     // workers (devices) on it
};

// Parses "a:2,b:1,[fe80::1]:2,c" (a host without ":N" has one slot). Throws ConfigError naming
// the bad entry: empty, slots not a positive integer, a host listed twice.
std::vector<HostSlots> parseHostList(const std::string& text);

// The job's devices split over the hosts, in order: `devices` lists one device per slot of the
// whole list (rank order), or a single device that every slot gets. `auto` is refused: which of a
// host's devices each slot takes is for the list to say. Throws ConfigError.
std::vector<std::vector<DeviceSpec>> devicesPerHost(const std::vector<HostSlots>& hosts,
                                                    const std::vector<DeviceSpec>& devices);

// The store's port when HostLaunchOptions::rdzv_endpoint is not given (torchrun's default too).
constexpr int kDefaultRendezvousPort = 29500;

struct HostLaunchOptions {
  // The hosts, node 0 first. REQUIRES: not empty.
  std::vector<HostSlots> hosts;
  // The command line of node `node_rank`'s agent (chorus run or chorus train, with --nnodes,
  // --node-rank, --rdzv-endpoint `endpoint` and --secret-stdin), run there through ssh. Required.
  std::function<std::vector<std::string>(int node_rank, const std::string& endpoint)> node_command;
  // HOST:PORT where node 0 hosts the store. Default: "" = the first host, kDefaultRendezvousPort.
  std::string rdzv_endpoint;
  // The ssh program. Default: "ssh".
  std::string ssh = "ssh";
  // ssh's configuration file (ssh -F), e.g. for a key, port or user. Default: "" (ssh's own).
  std::string ssh_config;
  // Where the remote commands start. Default: "" = this process's working directory.
  std::string working_directory;
  // An elastic job: a node whose agent fails or whose connection is lost does not stop the
  // others. Default: false (the first failure stops every node).
  bool elastic = false;
  // How long stopped nodes get before their ssh is killed: more than the agents' own grace, so
  // that their workers can stop cleanly (and write a checkpoint). Default: 15 s.
  std::chrono::milliseconds grace{15000};
};

// Quotes `word` for a POSIX shell: 'it'\''s'.
std::string shellQuote(const std::string& word);

// The ssh command line that runs `remote` (an argv) on node `node_rank`'s host in
// options.working_directory: ssh -o BatchMode=yes -o ServerAliveInterval=5 -o
// ServerAliveCountMax=3 [-F CONFIG] -- HOST 'cd DIR && exec ...' (a lost link ends ssh in ~15 s).
std::vector<std::string> sshCommand(const HostLaunchOptions& options, int node_rank,
                                    const std::vector<std::string>& remote);

// The endpoint the nodes meet at: options.rdzv_endpoint, or the first host's.
std::string rendezvousEndpoint(const HostLaunchOptions& options);

// Starts every node through ssh and waits for them. Returns 0 when every node's agent exited 0;
// 3 when one failed or its ssh did (the others are then stopped, unless elastic: then 0 when at
// least one node's agent exited 0); 128 + signal when interrupted (the nodes are stopped). Each
// failed node is logged with its host and what its exit code means (255: ssh could not connect
// or log in). Throws ConfigError for bad options, LaunchError when ssh cannot be started.
int runOnHosts(const HostLaunchOptions& options);

}  // namespace chorus::runtime
