// How the shared-memory transport fails: selection errors, deadlines that name the absent rank,
// peers that leave, ranks that disagree on the operation. Ranks are threads over a MemoryStore.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "chorus/comm/communicator.h"
#include "chorus/core/error.h"
#include "comm/rank_threads.h"

namespace chorus::comm {
namespace {

void runRanks(int size, const std::function<void(std::shared_ptr<Communicator>&)>& body,
              const CommOptions& options) {
  testing::runRankThreads(
      size, [&](std::shared_ptr<Communicator> communicator) { body(communicator); }, options);
}

CommOptions withTransport(const std::string& transport, int timeout_ms = 20000) {
  CommOptions options;
  options.cpu_transport = transport;
  options.shm_chunk_bytes = 4096;
  options.timeout = std::chrono::milliseconds(timeout_ms);
  return options;
}

TEST(ShmSelection, AutoPicksShmOnOneHostAndSubgroupsInherit) {
  runRanks(
      3,
      [](std::shared_ptr<Communicator>& comm) {
        EXPECT_STREQ(comm->cpuTransport(), "shm");
        if (comm->rank() == 2) return;
        auto pair = comm->subgroup({0, 1}, "pair");
        EXPECT_STREQ(pair->cpuTransport(), "shm");
        at::Tensor t = at::full({10}, comm->rank() + 1.0f);
        pair->allReduce(t).wait();
        EXPECT_TRUE(at::equal(t, at::full({10}, 3.0f)));
      },
      withTransport("auto"));
}

TEST(ShmSelection, GlooWhenAskedFor) {
  runRanks(
      2, [](std::shared_ptr<Communicator>& comm) { EXPECT_STREQ(comm->cpuTransport(), "gloo"); },
      withTransport("gloo"));
}

TEST(ShmSelection, UnknownTransportIsAConfigError) {
  EXPECT_THROW(runRanks(
                   1, [](std::shared_ptr<Communicator>&) {}, withTransport("infiniband")),
               ConfigError);
}

TEST(ShmSelection, ChunkThatIsNotALineMultipleIsRefusedUnderShm) {
  CommOptions options = withTransport("shm");
  options.shm_chunk_bytes = 100;
  EXPECT_THROW(runRanks(
                   2, [](std::shared_ptr<Communicator>&) {}, options),
               Error);
}

TEST(ShmFailure, TimeoutNamesTheRankThatNeverArrived) {
  runRanks(
      3,
      [](std::shared_ptr<Communicator>& comm) {
        at::Tensor t = at::ones({1000});
        comm->allReduce(t).wait();
        if (comm->rank() == 2) {
          // Alive (its transport thread holds its mutex) but never issues operation #1.
          std::this_thread::sleep_for(std::chrono::milliseconds(3500));
          return;
        }
        try {
          comm->allReduce(t).wait();
          ADD_FAILURE() << "no timeout";
        } catch (const TimeoutError& error) {
          EXPECT_EQ(error.missingRanks(), std::vector<int>{2}) << error.message();
          EXPECT_EQ(error.sequence(), 1);
          EXPECT_EQ(error.operation(), "all_reduce");
          EXPECT_NE(error.message().find("ranks not arrived: 2"), std::string::npos)
              << error.message();
        }
        EXPECT_TRUE(comm->broken());
        EXPECT_THROW(comm->allReduce(t).wait(), CommError);
      },
      withTransport("shm", 1500));
}

TEST(ShmFailure, PeerThatLeftIsAPeerFailureNotATimeout) {
  // A long deadline: only the departure can end rank 0's wait in time for the test.
  runRanks(
      2,
      [](std::shared_ptr<Communicator>& comm) {
        at::Tensor t = at::ones({64});
        comm->allReduce(t).wait();
        if (comm->rank() == 1) {
          comm.reset();  // leaves the group without issuing operation #1
          return;
        }
        try {
          comm->allReduce(t).wait();
          ADD_FAILURE() << "the departed peer went unnoticed";
        } catch (const PeerFailure& error) {
          EXPECT_EQ(error.ranks(), std::vector<int>{1}) << error.message();
          EXPECT_NE(error.message().find("all_reduce #1"), std::string::npos) << error.message();
        }
      },
      withTransport("shm", 600000));
}

TEST(ShmFailure, RanksThatDisagreeFailInsteadOfMixingData) {
  runRanks(
      2,
      [](std::shared_ptr<Communicator>& comm) {
        at::Tensor t = at::ones({comm->rank() == 0 ? 8 : 9});
        try {
          comm->allReduce(t).wait();
          ADD_FAILURE() << "mismatched sizes went unnoticed";
        } catch (const CommError& error) {
          EXPECT_NE(error.message().find("disagree"), std::string::npos) << error.message();
        }
      },
      withTransport("shm"));
}

TEST(ShmFailure, DestroyingWithQueuedOperationsFailsThemCleanly) {
  runRanks(
      2,
      [](std::shared_ptr<Communicator>& comm) {
        at::Tensor t = at::ones({64});
        comm->allReduce(t).wait();
        if (comm->rank() == 1) return;
        // Rank 1 is gone: the first queued operation fails on its departure, the rest with it.
        std::vector<Work> works;
        for (int i = 0; i < 3; ++i) works.push_back(comm->allReduce(t));
        comm.reset();
        for (Work& work : works) EXPECT_THROW(work.wait(), CommError);
      },
      withTransport("shm", 600000));
}

}  // namespace
}  // namespace chorus::comm
