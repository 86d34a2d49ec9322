// Communicator::abort: a rank blocked on a peer that never comes (a hung worker) is released
// within milliseconds, with the reason, on the shared-memory transport, and so is one waiting on a
// Gloo receive; subgroups break with their parent. Ranks are threads over one MemoryStore.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "chorus/comm/communicator.h"
#include "chorus/comm/store/memory_store.h"
#include "chorus/core/clock.h"
#include "chorus/core/error.h"

namespace chorus::comm {
namespace {

CommOptions shmOptions() {
  CommOptions options;
  options.cpu_transport = "shm";
  options.timeout = std::chrono::milliseconds(600000);  // only the abort can end the wait
  return options;
}

TEST(CommunicatorAbort, ReleasesARankWaitingForAPeerThatNeverComes) {
  auto store = std::make_shared<MemoryStore>();
  std::shared_ptr<Communicator> waiting, absent;
  std::thread peer([&] { absent = Communicator::create(store, 1, 2, shmOptions()); });
  waiting = Communicator::create(store, 0, 2, shmOptions());
  peer.join();
  std::string message;
  std::atomic<bool> ended{false};
  std::thread blocked([&] {
    at::Tensor tensor = at::ones({1024});
    try {
      waiting->allReduce(tensor).wait();  // rank 1 never enters it
    } catch (const CommError& error) {
      message = error.what();
    }
    ended.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(ended.load());  // it waits for rank 1, as long as its 10-minute deadline allows
  Stopwatch since_abort;
  waiting->abort("rank 1 missed 3 heartbeats");
  blocked.join();
  EXPECT_LT(since_abort.seconds(), 5.0);  // bounded by the transport's 5 ms checks, on any host
  EXPECT_NE(message.find("aborted"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 1 missed 3 heartbeats"), std::string::npos) << message;
  EXPECT_TRUE(waiting->broken());
  // Every later operation fails at once, quoting the reason.
  at::Tensor again = at::ones({4});
  try {
    waiting->allReduce(again).wait();
    FAIL() << "an aborted group ran an operation";
  } catch (const CommError& error) {
    EXPECT_NE(std::string(error.what()).find("rank 1 missed 3 heartbeats"), std::string::npos);
  }
}

// A pipeline stage waits on a Gloo receive from a live peer that has gone into elastic recovery
// (it will never send): the receive cannot be waited in slices as a collective is, so abort()
// aborts it, and the wait ends at once rather than at its deadline.
TEST(CommunicatorAbort, ReleasesAGlooReceiveFromALivePeerThatNeverSends) {
  auto store = std::make_shared<MemoryStore>();
  CommOptions gloo = shmOptions();
  gloo.cpu_transport = "gloo";
  std::shared_ptr<Communicator> waiting, silent;
  std::thread peer([&] { silent = Communicator::create(store, 1, 2, gloo); });
  waiting = Communicator::create(store, 0, 2, gloo);
  peer.join();
  std::string message;
  std::atomic<bool> ended{false};
  std::thread blocked([&] {
    at::Tensor tensor = at::empty({16});
    try {
      waiting->recv(tensor, 1).wait();  // rank 1 is alive and never sends
    } catch (const CommError& error) {
      message = error.what();
    }
    ended.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(ended.load());
  Stopwatch since_abort;
  waiting->abort("rank 2 lost");
  blocked.join();
  EXPECT_LT(since_abort.seconds(), 5.0);  // its deadline is 10 minutes
  EXPECT_NE(message.find("aborted"), std::string::npos) << message;
  EXPECT_TRUE(waiting->broken());
}

TEST(CommunicatorAbort, BreaksSubgroupsToo) {
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::shared_ptr<Communicator>> worlds(2), pairs(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank)
    threads.emplace_back([&, rank] {
      worlds[rank] = Communicator::create(store, rank, 2, shmOptions());
      pairs[rank] = worlds[rank]->subgroup({0, 1}, "pair");
    });
  for (auto& thread : threads) thread.join();
  worlds[0]->abort("lost");
  EXPECT_TRUE(pairs[0]->broken());
  EXPECT_FALSE(worlds[1]->broken());  // an abort is local: the peer learns of it otherwise
  at::Tensor tensor = at::ones({4});
  EXPECT_THROW(pairs[0]->allReduce(tensor).wait(), CommError);
}

}  // namespace
}  // namespace chorus::comm
