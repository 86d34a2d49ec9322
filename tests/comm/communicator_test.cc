// Communicator tests with ranks as threads over one in-memory store (the multi-process versions,
// through the launcher, are in tests/runtime/launch/launcher_multiproc_test.cc).
#include "chorus/comm/communicator.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "chorus/comm/store/memory_store.h"
#include "chorus/core/clock.h"
#include "chorus/core/error.h"
#include "comm/rank_threads.h"

namespace chorus::comm {
namespace {

// Runs `body(rank, communicator)` on `size` threads; rethrows the first failure.
void runRanks(int size, const std::function<void(Communicator&)>& body, CommOptions options = {}) {
  testing::runRankThreads(
      size, [&](std::shared_ptr<Communicator> communicator) { body(*communicator); }, options);
}

TEST(Communicator, AllReduceSumsRankContributions) {
  runRanks(3, [](Communicator& comm) {
    at::Tensor t = at::full({5}, static_cast<float>(comm.rank()));
    comm.allReduce(t).wait();
    EXPECT_TRUE(at::equal(t, at::full({5}, 3.0f)));
  });
}

TEST(Communicator, CountsBytesAndOperations) {
  runRanks(2, [](Communicator& comm) {
    at::Tensor t = at::ones({256});
    comm.allReduce(t).wait();
    comm.allReduce(t).wait();
    comm.barrier().wait();
    const auto stats = comm.stats();
    EXPECT_EQ(stats.at("all_reduce").count, 2u);
    EXPECT_EQ(stats.at("all_reduce").bytes, 2u * 256 * 4);
    EXPECT_EQ(stats.at("barrier").count, 1u);
    EXPECT_GT(stats.at("all_reduce").seconds, 0.0);
  });
}

TEST(Communicator, TimeoutNamesTheRankThatNeverArrived) {
  CommOptions options;
  options.timeout = std::chrono::milliseconds(1500);
  runRanks(
      3,
      [](Communicator& comm) {
        at::Tensor t = at::ones({4});
        comm.allReduce(t).wait();
        if (comm.rank() == 2) {
          std::this_thread::sleep_for(std::chrono::milliseconds(4000));
          return;  // never joins operation #1
        }
        Stopwatch clock;
        try {
          comm.allReduce(t).wait();
          ADD_FAILURE() << "no timeout";
        } catch (const TimeoutError& error) {
          EXPECT_EQ(error.missingRanks(), std::vector<int>{2}) << error.message();
          EXPECT_EQ(error.sequence(), 1);
          EXPECT_EQ(error.operation(), "all_reduce");
          EXPECT_NE(error.message().find("ranks not arrived: 2"), std::string::npos);
          EXPECT_LT(clock.seconds(), 1.5 + 2.0);
        }
        EXPECT_TRUE(comm.broken());
        EXPECT_THROW(comm.allReduce(t), CommError);
      },
      options);
}

TEST(Communicator, JoinTimeoutNamesAbsentRanks) {
  auto store = std::make_shared<MemoryStore>();
  CommOptions options;
  options.timeout = std::chrono::milliseconds(500);
  try {
    Communicator::create(store, 0, 3, options);
    FAIL() << "joined without peers";
  } catch (const TimeoutError& error) {
    EXPECT_EQ(error.missingRanks(), (std::vector<int>{1, 2}));
  }
}

TEST(Communicator, SubgroupUsesItsOwnRanksAndNamesGlobalOnes) {
  runRanks(4, [](Communicator& comm) {
    const std::vector<int> odd{1, 3}, even{0, 2};
    auto group = comm.subgroup(comm.rank() % 2 ? odd : even, comm.rank() % 2 ? "odd" : "even");
    EXPECT_EQ(group->size(), 2);
    EXPECT_EQ(group->globalRank(group->rank()), comm.rank());
    at::Tensor t = at::full({3}, static_cast<float>(comm.rank()));
    group->allReduce(t).wait();
    EXPECT_TRUE(at::equal(t, at::full({3}, comm.rank() % 2 ? 4.0f : 2.0f)));
  });
}

// Hosts of 1, 2 and 3 ranks (uneven), interleaved: the split must find them and pick the lowest
// rank of each host as its leader.
TEST(Communicator, SplitByHostFindsUnevenHostsAndLeaders) {
  const std::vector<std::string> host_of{"a", "b", "b", "c", "c", "c"};
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::thread> threads;
  std::vector<std::string> failures(6);
  for (int rank = 0; rank < 6; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        CommOptions options;
        options.host_id = host_of[rank];
        auto comm = Communicator::create(store, rank, 6, options);
        auto groups = comm->splitByHost();
        const std::vector<std::vector<int>> expected{{0}, {1, 2}, {3, 4, 5}};
        if (groups.hosts != expected) failures[rank] = "wrong hosts";
        at::Tensor local = at::full({2}, static_cast<float>(rank));
        groups.local->allReduce(local).wait();
        const float expected_local = host_of[rank] == "a" ? 0 : host_of[rank] == "b" ? 3 : 12;
        if (!at::equal(local, at::full({2}, expected_local))) failures[rank] = "wrong local sum";
        const bool leader = rank == 0 || rank == 1 || rank == 3;
        if (leader != (groups.leaders != nullptr)) failures[rank] = "wrong leadership";
        if (groups.leaders) {
          at::Tensor sum = local.clone();
          groups.leaders->allReduce(sum).wait();
          if (!at::equal(sum, at::full({2}, 15.0f))) failures[rank] = "wrong leader sum";
        }
      } catch (const std::exception& error) {
        failures[rank] = error.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int rank = 0; rank < 6; ++rank) EXPECT_EQ(failures[rank], "") << "rank " << rank;
}

TEST(Communicator, RejectsMisuseWithClearErrors) {
  runRanks(2, [](Communicator& comm) {
    at::Tensor t = at::ones({4, 4}).t();  // not contiguous
    EXPECT_THROW(comm.allReduce(t), ConfigError);
    at::Tensor ints = at::ones({4}, at::kInt);
    EXPECT_THROW(comm.allReduce(ints, ReduceOp::kAvg), ConfigError);
    at::Tensor out = at::empty({3});
    EXPECT_THROW(comm.allGather(at::ones({2}), out), ConfigError);
    EXPECT_THROW(comm.send(at::ones({2}), comm.rank()), ConfigError);
  });
}

}  // namespace
}  // namespace chorus::comm
