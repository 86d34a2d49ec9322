// `-H HOSTS` for `chorus run` and `chorus train`: start the job's nodes on a host list over ssh
// (runtime/launch/host_launch.h). Each command builds its nodes' command lines; this holds what
// they share.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "chorus/runtime/launch/host_launch.h"

namespace chorus::cli {

// The -H options as given. Value type.
struct HostListArgs {
  std::string hosts;       // "a:2,b:1"; empty: not given
  std::string ssh_config;  // ssh -F FILE; empty: ssh's own configuration

  bool given() const { return !hosts.empty(); }
};

// Adds -H/--hosts and --ssh-config to `command`.
void addHostListOptions(CLI::App& command, HostListArgs& args);

// What -H decides itself cannot also be given: --nnodes, --node-rank, --secret-file and
// --secret-stdin. Throws ConfigError naming the option.
void refuseWithHostList(int nnodes, int node_rank, const std::string& secret_file,
                        bool secret_stdin);

// The launch options for `args` and a node command; rdzv_endpoint as given (may be empty).
runtime::HostLaunchOptions hostLaunchOptions(const HostListArgs& args,
                                             const std::string& rdzv_endpoint);

}  // namespace chorus::cli
