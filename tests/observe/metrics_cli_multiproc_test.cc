// `chorus train --metrics-port`: a busy port and a privileged port (as a user that is not root)
// are refused with one clear line and exit code 2 before any worker starts (docs/errors.md).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "runtime/chorus_cli.h"

namespace chorus::observe {
namespace {

const std::string kJob =
    " train --set devices=cpu,cpu@0.5 --set model.kind=mlp --set data.dataset=synthetic"
    " --set train.eval_every=0 --set train.target_accuracy=0 --steps 3";

// A socket listening on a free port of every interface, held for the test's lifetime.
class BusyPort {
 public:
  BusyPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t length = sizeof address;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&address), length) != 0 || ::listen(fd_, 1) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0)
      ADD_FAILURE() << "cannot listen on a free port";
    port_ = ntohs(address.sin_port);
  }
  ~BusyPort() { ::close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

TEST(MetricsPortBadInput, ABusyPortIsRefusedBeforeAnyWorkerStarts) {
  BusyPort busy;
  const auto result = chorus::testing::runCommand(std::string(CHORUS_BINARY) + kJob +
                                                  " --metrics-port " + std::to_string(busy.port()));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(
      result.output.find("chorus: ConfigError: --metrics-port " + std::to_string(busy.port()) +
                         ": cannot listen on 0.0.0.0:" + std::to_string(busy.port())),
      std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("is the port busy?"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("[rank 0]"), std::string::npos) << "a worker started";
}

TEST(MetricsPortBadInput, APortBelow1024IsRefusedForAUserThatIsNotRoot) {
  // As root, the command runs in a new user namespace (unshare, util-linux), where its uid is
  // the overflow uid 65534 and it has no capability on the host's network, yet still reads the
  // files of root's home that libtorch may be installed in; as any other user, as itself.
  const std::string as_user = ::geteuid() == 0 ? "unshare --user " : "";
  const auto result =
      chorus::testing::runCommand(as_user + CHORUS_BINARY + kJob + " --metrics-port 80");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("chorus: ConfigError: --metrics-port 80: ports below 1024 are "
                               "privileged and this process is not root"),
            std::string::npos)
      << result.output;
}

TEST(MetricsPortBadInput, PortZeroIsLoggedAndTheJobRunsToTheEnd) {
  const auto run = chorus::testing::chorusTrain(kJob.substr(7) + " --metrics-port 0", "port0");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("/metrics, live page on http://"), std::string::npos) << run.output;
  EXPECT_EQ(run.steps.size(), 3u);
}

}  // namespace
}  // namespace chorus::observe
