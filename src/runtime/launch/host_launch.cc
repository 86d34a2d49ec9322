#include "chorus/runtime/launch/host_launch.h"

#include <unistd.h>

#include <filesystem>
#include <numeric>
#include <set>

#include "chorus/comm/store/job_secret.h"
#include "chorus/core/error.h"
#include "chorus/core/logging.h"
#include "chorus/runtime/launch/supervisor.h"

namespace chorus::runtime {
namespace {

// ssh's own exit code when it could not connect or log in (the remote command's is passed on).
constexpr int kSshFailed = 255;

int parseSlots(const std::string& text, const std::string& entry) {
  try {
    size_t used = 0;
    const int slots = std::stoi(text, &used);
    if (used == text.size() && slots >= 1) return slots;
  } catch (const std::logic_error&) {
  }
  CHORUS_THROW(ConfigError, "-H: '", entry, "': the slots after ':' must be a positive integer");
}

HostSlots parseEntry(const std::string& entry) {
  CHORUS_CHECK_CONFIG(!entry.empty(), "-H: an empty host in the list");
  HostSlots parsed;
  std::string rest;
  if (entry.front() == '[') {  // [IPv6]:slots
    const size_t close = entry.find(']');
    CHORUS_CHECK_CONFIG(close != std::string::npos && close > 1, "-H: '", entry,
                        "': an IPv6 address goes in brackets, e.g. [fe80::1]:2");
    parsed.host = entry.substr(1, close - 1);
    rest = entry.substr(close + 1);
    CHORUS_CHECK_CONFIG(rest.empty() || rest.front() == ':', "-H: '", entry,
                        "': expected :SLOTS after the bracketed address");
    if (!rest.empty()) rest = rest.substr(1);
  } else {
    const size_t colon = entry.find(':');
    parsed.host = entry.substr(0, colon);
    if (colon != std::string::npos) rest = entry.substr(colon + 1);
    CHORUS_CHECK_CONFIG(!parsed.host.empty(), "-H: '", entry, "': no host before ':'");
    CHORUS_CHECK_CONFIG(colon == std::string::npos || !rest.empty(), "-H: '", entry,
                        "': no slots after ':'");
  }
  if (!rest.empty()) parsed.slots = parseSlots(rest, entry);
  return parsed;
}

// The host as an endpoint's host part: IPv6 addresses in brackets.
std::string endpointHost(const std::string& host) {
  return host.find(':') == std::string::npos ? host : "[" + host + "]";
}

std::string describeExit(const WorkerExit& exit, const HostSlots& host) {
  const std::string node = detail::concat("node ", exit.rank, " (", host.host, ")");
  if (exit.signaled) return detail::concat(node, ": its ssh was killed by signal ", exit.code);
  if (exit.code == kSshFailed)
    return detail::concat(node,
                          ": ssh exited with 255: it could not connect or log in (BatchMode: "
                          "no password prompt, no unknown host key), or the connection was "
                          "lost");
  return detail::concat(node, ": its agent exited with code ", exit.code);
}

int reportOutcome(const HostLaunchOptions& options, const SupervisorOutcome& outcome) {
  int succeeded = 0;
  for (const WorkerExit& exit : outcome.exits) {
    if (exit.success())
      ++succeeded;
    else if (!exit.stopped)
      logError("chorus run -H: ", describeExit(exit, options.hosts.at(exit.rank)));
  }
  if (outcome.interrupt_signal != 0) {
    logWarn("chorus run -H: interrupted by signal ", outcome.interrupt_signal,
            "; the nodes were stopped");
    return 128 + outcome.interrupt_signal;
  }
  const auto nodes = static_cast<int>(options.hosts.size());
  if (succeeded == nodes) return 0;
  if (options.elastic && succeeded > 0) {
    logInfo("chorus run -H: ", nodes - succeeded, " of ", nodes,
            " nodes were lost; the others finished");
    return 0;
  }
  return 3;
}

}  // namespace

std::vector<HostSlots> parseHostList(const std::string& text) {
  std::vector<HostSlots> hosts;
  std::set<std::string> seen;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    const std::string entry = text.substr(start, comma - start);
    hosts.push_back(parseEntry(entry));
    CHORUS_CHECK_CONFIG(seen.insert(hosts.back().host).second, "-H: host '", hosts.back().host,
                        "' is listed twice; give it more slots instead (", hosts.back().host,
                        ":N)");
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return hosts;
}

std::vector<std::vector<DeviceSpec>> devicesPerHost(const std::vector<HostSlots>& hosts,
                                                    const std::vector<DeviceSpec>& devices) {
  const int slots = std::accumulate(hosts.begin(), hosts.end(), 0,
                                    [](int sum, const HostSlots& h) { return sum + h.slots; });
  for (const DeviceSpec& device : devices)
    CHORUS_CHECK_CONFIG(device.kind != DeviceKind::kAuto,
                        "-H: devices 'auto': list one device per slot of the host list (", slots,
                        " slots), e.g. cuda:0,cuda:1 for a host with 2 slots");
  const bool one_for_all = devices.size() == 1;
  CHORUS_CHECK_CONFIG(one_for_all || static_cast<int>(devices.size()) == slots,
                      "-H: ", devices.size(), " devices (", toString(devices), ") for ", slots,
                      " slots; list one device per slot, in host order, or one for every slot");
  std::vector<std::vector<DeviceSpec>> split;
  size_t next = 0;
  for (const HostSlots& host : hosts) {
    std::vector<DeviceSpec> own;
    for (int slot = 0; slot < host.slots; ++slot)
      own.push_back(one_for_all ? devices.front() : devices[next++]);
    split.push_back(std::move(own));
  }
  return split;
}

std::string shellQuote(const std::string& word) {
  std::string quoted = "'";
  for (const char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string rendezvousEndpoint(const HostLaunchOptions& options) {
  if (!options.rdzv_endpoint.empty()) return options.rdzv_endpoint;
  CHORUS_CHECK_CONFIG(!options.hosts.empty(), "-H: no hosts");
  return endpointHost(options.hosts.front().host) + ":" + std::to_string(kDefaultRendezvousPort);
}

std::vector<std::string> sshCommand(const HostLaunchOptions& options, int node_rank,
                                    const std::vector<std::string>& remote) {
  const std::string dir = options.working_directory.empty()
                              ? std::filesystem::current_path().string()
                              : options.working_directory;
  std::string script = "cd " + shellQuote(dir) + " && exec";
  for (const std::string& word : remote) script += " " + shellQuote(word);
  // Keepalives: a node whose link goes down ends its ssh (255) within about 15 s, instead of a
  // TCP timeout of many minutes, so the launcher learns that the node is lost.
  std::vector<std::string> command{options.ssh};
  for (const char* option : {"BatchMode=yes", "ServerAliveInterval=5", "ServerAliveCountMax=3"})
    command.insert(command.end(), {"-o", option});
  if (!options.ssh_config.empty()) command.insert(command.end(), {"-F", options.ssh_config});
  command.insert(command.end(), {"--", options.hosts.at(node_rank).host, script});
  return command;
}

int runOnHosts(const HostLaunchOptions& options) {
  CHORUS_CHECK_CONFIG(!options.hosts.empty(), "-H: no hosts");
  CHORUS_CHECK_CONFIG(static_cast<bool>(options.node_command), "-H: no node command");
  const std::string endpoint = rendezvousEndpoint(options);
  const comm::JobSecret secret = comm::JobSecret::generate();
  std::vector<WorkerLaunch> launches;
  std::string described;
  for (size_t node = 0; node < options.hosts.size(); ++node) {
    WorkerLaunch launch;
    launch.rank = static_cast<int>(node);
    launch.argv = sshCommand(options, launch.rank, options.node_command(launch.rank, endpoint));
    launch.secret = secret;
    launch.secret_on_stdin = true;
    launches.push_back(std::move(launch));
    described += detail::concat(node == 0 ? "" : ", ", options.hosts[node].host, " (",
                                options.hosts[node].slots, ")");
  }
  logInfo("chorus run -H: starting ", options.hosts.size(), " nodes over ssh: ", described,
          "; store at ", endpoint, ", job secret ", secret.fingerprint());
  SupervisorOptions supervision;
  supervision.prefix_output = false;  // the agents prefix their workers' lines with the rank
  supervision.grace = options.grace;
  supervision.stop_on_failure = !options.elastic;
  Supervisor supervisor(supervision);
  supervisor.start(launches);
  return reportOutcome(options, supervisor.run());
}

}  // namespace chorus::runtime
