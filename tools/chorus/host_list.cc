#include "host_list.h"

#include "chorus/core/error.h"

namespace chorus::cli {

void addHostListOptions(CLI::App& command, HostListArgs& args) {
  command.add_option("-H,--hosts", args.hosts,
                     "Start the job on these hosts over ssh, HOST:SLOTS comma-separated (e.g. "
                     "a:2,b:1; node 0 first, it hosts the store); --devices then lists one device "
                     "per slot in host order, or one for all (docs/deploy.md)");
  command.add_option("--ssh-config", args.ssh_config,
                     "With -H: ssh's configuration file (ssh -F), e.g. for a key, port or user");
}

void refuseWithHostList(int nnodes, int node_rank, const std::string& secret_file,
                        bool secret_stdin) {
  CHORUS_CHECK_CONFIG(nnodes == 1 && node_rank == 0,
                      "-H numbers the nodes itself (one per host); drop --nnodes and --node-rank");
  CHORUS_CHECK_CONFIG(secret_file.empty() && !secret_stdin,
                      "-H generates the job's secret and hands it to each node over ssh; drop "
                      "--secret-file and --secret-stdin");
}

runtime::HostLaunchOptions hostLaunchOptions(const HostListArgs& args,
                                             const std::string& rdzv_endpoint) {
  runtime::HostLaunchOptions options;
  options.hosts = runtime::parseHostList(args.hosts);
  options.ssh_config = args.ssh_config;
  options.rdzv_endpoint = rdzv_endpoint;
  return options;
}

}  // namespace chorus::cli
