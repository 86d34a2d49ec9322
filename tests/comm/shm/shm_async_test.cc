// Who runs a shared-memory operation and when: an operation waited at once runs on the caller's
// thread, one that nobody waits for still runs in the background (gradient buckets rely on it),
// and whichever thread runs them, operations run in issue order with the same errors.
// Ranks are threads over a MemoryStore.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "chorus/comm/communicator.h"
#include "chorus/core/error.h"
#include "comm/rank_threads.h"

namespace chorus::comm {
namespace {

using testing::runRankThreads;

CommOptions shmOptions(int timeout_ms = 20000) {
  CommOptions options;
  options.cpu_transport = "shm";
  options.shm_chunk_bytes = 1024;
  options.timeout = std::chrono::milliseconds(timeout_ms);
  return options;
}

// Polls without waiting: true once `work` completed, false after `limit`.
bool completesWithin(const Work& work, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!work.isCompleted()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

TEST(ShmAsync, OperationsNobodyWaitsForCompleteInTheBackground) {
  runRankThreads(
      2,
      [](std::shared_ptr<Communicator> comm) {
        // Several chunks, so the background thread steps through several barriers. The first
        // one starts with the transport's thread asleep (woken by the submission), the second
        // after an operation the caller ran itself (the thread naps and finds it).
        for (int round = 0; round < 2; ++round) {
          at::Tensor t = at::full({4000}, comm->rank() + 1, at::kFloat);
          Work work = comm->allReduce(t);
          EXPECT_TRUE(completesWithin(work, std::chrono::seconds(10))) << round;
          work.wait();
          EXPECT_TRUE(at::equal(t, at::full({4000}, 3, at::kFloat)));
          comm->barrier().wait();
        }
      },
      shmOptions());
}

TEST(ShmAsync, WaitingALaterOperationRunsTheEarlierOnesFirstInOrder) {
  runRankThreads(
      2,
      [](std::shared_ptr<Communicator> comm) {
        std::vector<at::Tensor> tensors;
        std::vector<Work> works;
        for (int i = 0; i < 6; ++i) {
          tensors.push_back(at::full({300 + 100 * i}, comm->rank() + i, at::kFloat));
          works.push_back(comm->allReduce(tensors.back()));
        }
        // Waiting only for the last operation: the earlier ones ran first, whoever ran them.
        at::Tensor marker = at::full({10}, comm->rank(), at::kInt);
        comm->broadcast(marker, 1).wait();
        EXPECT_TRUE(at::equal(marker, at::full({10}, 1, at::kInt)));
        for (int i = 0; i < 6; ++i) {
          EXPECT_TRUE(works[i].isCompleted()) << i;
          works[i].wait();
          EXPECT_TRUE(at::equal(tensors[i], at::full({300 + 100 * i}, 1 + 2 * i, at::kFloat)));
        }
      },
      shmOptions());
}

TEST(ShmAsync, WorksWaitedFromAnotherThreadWhileTheIssuerKeepsGoing) {
  runRankThreads(
      2,
      [](std::shared_ptr<Communicator> comm) {
        constexpr int kOps = 40;
        std::vector<at::Tensor> tensors;
        std::vector<Work> works;
        for (int i = 0; i < kOps; ++i)
          tensors.push_back(at::full({64 + 32 * (i % 5)}, comm->rank() + i, at::kFloat));
        for (int i = 0; i < kOps / 2; ++i) works.push_back(comm->allReduce(tensors[i]));
        std::thread waiter([&works] {
          for (int i = kOps / 2 - 1; i >= 0; --i) works[i].wait();
        });
        for (int i = kOps / 2; i < kOps; ++i) comm->allReduce(tensors[i]).wait();
        waiter.join();
        for (int i = 0; i < kOps; ++i)
          EXPECT_TRUE(at::equal(tensors[i], at::full_like(tensors[i], 1 + 2 * i))) << i;
      },
      shmOptions());
}

TEST(ShmAsync, BackgroundOperationTimesOutNamingTheAbsentRank) {
  runRankThreads(
      2,
      [](std::shared_ptr<Communicator> comm) {
        at::Tensor t = at::ones({100});
        comm->allReduce(t).wait();
        if (comm->rank() == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2500));
          return;
        }
        // Never waited until after its deadline: the transport's thread ran it and timed out.
        Work work = comm->allReduce(t);
        EXPECT_TRUE(completesWithin(work, std::chrono::seconds(10)));
        try {
          work.wait();
          ADD_FAILURE() << "no timeout";
        } catch (const TimeoutError& error) {
          EXPECT_EQ(error.missingRanks(), std::vector<int>{1}) << error.message();
          EXPECT_EQ(error.sequence(), 1);
        }
      },
      shmOptions(1000));
}

}  // namespace
}  // namespace chorus::comm
