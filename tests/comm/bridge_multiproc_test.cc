// The bridge between groups, with ranks as processes: four processes on two declared hosts
// (CommOptions::host_id "h0", "h0", "h1", "h1"), each host's pair reducing over shared memory and
// the two leaders meeting over Gloo (declared hosts never share memory, even on one machine). The
// hierarchical and the 2-D all-reduce must give every rank exactly the sum, on integer-valued
// inputs whose sums are exact in fp32 in any order. The peers are this test binary itself,
// started again with a filter that selects the Peer test and their rank in the environment.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>

#include "chorus/comm/communicator.h"
#include "chorus/comm/hierarchical_all_reduce.h"
#include "chorus/comm/store/job_secret.h"
#include "chorus/comm/store/tcp_store.h"
#include "chorus/comm/topology.h"
#include "chorus/core/error.h"
#include "comm/self_process.h"

namespace chorus::comm {
namespace {

constexpr const char* kPeerVariable = "CHORUS_BRIDGE_PEER";
constexpr int kRanks = 4;
// Above HierarchicalOptions::two_d_min_bytes for auto's 2-D form, and several shm chunks.
constexpr std::int64_t kNumel = (3 << 20) / 4 + 5;

std::string hostOf(int rank) { return rank < 2 ? "h0" : "h1"; }

std::shared_ptr<Communicator> join(int port, const std::string& secret, int rank) {
  TcpStoreOptions client;
  client.port = port;
  client.secret = JobSecret::fromText(secret);
  CommOptions options;
  options.name = "bridge";
  options.host_id = hostOf(rank);
  options.timeout = std::chrono::milliseconds(120000);
  return Communicator::create(std::make_shared<TcpStore>(client), rank, kRanks, options);
}

// Rank r's input: integers below 2^10, so that every partial sum is exact in fp32.
at::Tensor inputOf(int rank) {
  return at::remainder(at::arange(kNumel, at::kFloat) * (rank + 3) + rank, 1021);
}

at::Tensor expectedSum() {
  at::Tensor sum = at::zeros({kNumel}, at::kFloat);
  for (int rank = 0; rank < kRanks; ++rank) sum += inputOf(rank);
  return sum;
}

// What every rank does; EXPECTs fail the process's test (a peer then exits non-zero).
void runRank(int port, const std::string& secret, int rank) {
  auto world = join(port, secret, rank);
  RankDescriptor self;
  self.host_id = hostOf(rank);
  const Topology topology = Topology::discover(*world, self, GroupBy::kHostAndVendor);
  ASSERT_EQ(topology.numGroups(), 2) << topology.describe();
  const at::Tensor expected = expectedSum();
  for (const char* algorithm : {"hierarchical", "2d", "auto"}) {
    HierarchicalOptions options;
    options.algorithm = parseAllReduceAlgorithm(algorithm);
    options.name = std::string("bridge-") + algorithm;
    HierarchicalAllReduce engine(world, topology, options);
    const bool leader = rank == 0 || rank == 2;
    EXPECT_EQ(engine.describeTransports(),
              leader ? "local shm, leaders gloo" : std::string("local shm"))
        << "rank " << rank;
    for (auto op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      at::Tensor tensor = inputOf(rank);
      engine.allReduce(tensor, op).wait();
      const at::Tensor want = op == ReduceOp::kSum ? expected : expected / kRanks;
      EXPECT_TRUE(at::equal(tensor, want)) << algorithm << " on rank " << rank << ": max error "
                                           << (tensor - want).abs().max().item<float>();
    }
    EXPECT_EQ(engine.choose(kNumel * 4), options.algorithm == AllReduceAlgorithm::kAuto
                                             ? AllReduceAlgorithm::kTwoD
                                             : options.algorithm);
  }
}

pid_t startPeer(int port, const std::string& secret, int rank) {
  return testing::startSelf(kPeerVariable,
                            std::to_string(port) + " " + secret + " " + std::to_string(rank),
                            "BridgeMultiproc.Peer");
}

TEST(BridgeMultiproc, TwoShmGroupsJoinedByGlooLeadersSumExactly) {
  if (std::getenv(kPeerVariable)) GTEST_SKIP() << "this process is a peer";
  const JobSecret secret = JobSecret::generate();
  TcpStoreServerOptions server_options;
  server_options.host = "127.0.0.1";
  server_options.secret = secret;
  TcpStoreServer server(server_options);
  std::vector<pid_t> peers;
  for (int rank = 1; rank < kRanks; ++rank) {
    peers.push_back(startPeer(server.port(), secret.text(), rank));
    ASSERT_GT(peers.back(), 0);
  }
  runRank(server.port(), secret.text(), 0);
  for (size_t index = 0; index < peers.size(); ++index) {
    int status = 0;
    ASSERT_EQ(waitpid(peers[index], &status, 0), peers[index]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "rank " << index + 1 << " failed (status " << status << ")";
  }
}

// A peer rank of TwoShmGroupsJoinedByGlooLeadersSumExactly.
TEST(BridgeMultiproc, Peer) {
  const char* spec = std::getenv(kPeerVariable);
  if (!spec) GTEST_SKIP() << "runs only as a peer process of TwoShmGroupsJoinedByGloo...";
  std::istringstream fields(spec);
  int port = 0, rank = 0;
  std::string secret;
  fields >> port >> secret >> rank;
  runRank(port, secret, rank);
}

}  // namespace
}  // namespace chorus::comm
