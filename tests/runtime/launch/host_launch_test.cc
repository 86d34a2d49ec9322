#include "chorus/runtime/launch/host_launch.h"

#include <gtest/gtest.h>

#include "chorus/core/error.h"

namespace chorus::runtime {
namespace {

std::vector<std::string> hostsOf(const std::vector<HostSlots>& list) {
  std::vector<std::string> hosts;
  for (const HostSlots& entry : list)
    hosts.push_back(entry.host + "/" + std::to_string(entry.slots));
  return hosts;
}

TEST(HostList, ParsesHostsSlotsAndBracketedAddresses) {
  EXPECT_EQ(hostsOf(parseHostList("a:2,b:1,[fe80::1]:3,c,[::1]")),
            (std::vector<std::string>{"a/2", "b/1", "fe80::1/3", "c/1", "::1/1"}));
}

TEST(HostList, RefusesBadEntriesNamingThem) {
  for (const char* bad :
       {"", "a,,b", "a:", ":2", "a:0", "a:-1", "a:2x", "[::1", "[]:2", "[::1]2", "a:1,a:2"}) {
    try {
      parseHostList(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const ConfigError& error) {
      EXPECT_NE(std::string(error.what()).find("-H"), std::string::npos) << error.what();
    }
  }
}

TEST(HostList, SplitsOneDevicePerSlotInHostOrder) {
  const auto split =
      devicesPerHost(parseHostList("a:2,b:1"), parseDeviceSpecs("cuda:0,cuda:1/20GiB,cpu@0.5"));
  ASSERT_EQ(split.size(), 2u);
  EXPECT_EQ(toString(split[0]), "cuda:0,cuda:1/20G");
  EXPECT_EQ(toString(split[1]), "cpu@0.5");
}

TEST(HostList, GivesOneDeviceToEverySlot) {
  const auto split = devicesPerHost(parseHostList("a:2,b:3"), parseDeviceSpecs("cpu"));
  EXPECT_EQ(toString(split[0]), "cpu,cpu");
  EXPECT_EQ(toString(split[1]), "cpu,cpu,cpu");
}

TEST(HostList, RefusesAutoAndACountThatIsNotTheSlots) {
  const auto hosts = parseHostList("a:2,b:1");
  EXPECT_THROW(devicesPerHost(hosts, parseDeviceSpecs("auto")), ConfigError);
  EXPECT_THROW(devicesPerHost(hosts, parseDeviceSpecs("cpu,cpu")), ConfigError);
  EXPECT_THROW(devicesPerHost(hosts, parseDeviceSpecs("cpu,cpu,cpu,cpu")), ConfigError);
}

TEST(HostList, QuotesEveryWordForTheRemoteShell) {
  EXPECT_EQ(shellQuote("plain"), "'plain'");
  EXPECT_EQ(shellQuote("it's $HOME; rm -rf /"), "'it'\\''s $HOME; rm -rf /'");
  EXPECT_EQ(shellQuote(""), "''");
}

TEST(HostList, SshCommandRunsTheNodeInTheWorkingDirectoryWithoutAPrompt) {
  HostLaunchOptions options;
  options.hosts = parseHostList("gpu0:2,gpu1:1");
  options.ssh_config = "/etc/chorus/ssh_config";
  options.working_directory = "/home/me/my job";
  EXPECT_EQ(sshCommand(options, 1, {"/opt/chorus", "run", "--", "python3", "train.py"}),
            (std::vector<std::string>{"ssh", "-o", "BatchMode=yes", "-o", "ServerAliveInterval=5",
                                      "-o", "ServerAliveCountMax=3", "-F", "/etc/chorus/ssh_config",
                                      "--", "gpu1",
                                      "cd '/home/me/my job' && exec '/opt/chorus' 'run' '--' "
                                      "'python3' 'train.py'"}));
}

TEST(HostList, TheStoreIsOnTheFirstHostUnlessGiven) {
  HostLaunchOptions options;
  options.hosts = parseHostList("gpu0:2,gpu1:1");
  EXPECT_EQ(rendezvousEndpoint(options), "gpu0:29500");
  options.hosts = parseHostList("[fe80::1]:1");
  EXPECT_EQ(rendezvousEndpoint(options), "[fe80::1]:29500");
  options.rdzv_endpoint = "10.0.0.1:1234";
  EXPECT_EQ(rendezvousEndpoint(options), "10.0.0.1:1234");
}

}  // namespace
}  // namespace chorus::runtime
