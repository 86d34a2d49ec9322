// The contract every Store keeps, run against each implementation: MemoryStore (threads of one
// process), TcpStore (clients of a TcpStoreServer) and EtcdStore (clients of a real etcd, which
// the suite starts). Each test's clients share one backing store; a thread that blocks gets a
// client of its own, as a worker's threads do (Worker::openStoreConnection).
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "chorus/comm/store/etcd_store.h"
#include "chorus/comm/store/memory_store.h"
#include "chorus/comm/store/tcp_store.h"
#include "chorus/core/clock.h"
#include "chorus/core/error.h"
#include "comm/store/etcd_process.h"
#include "comm/store/store_options.h"

namespace chorus::comm {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kLong{10000};

class StoreContract : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string& kind = GetParam();
    if (kind == "memory") {
      auto memory = std::make_shared<MemoryStore>();
      connect_ = [memory] { return memory; };
    } else if (kind == "tcp") {
      const JobSecret secret = JobSecret::generate();
      server_ = std::make_unique<TcpStoreServer>(testing::loopbackServerOptions(secret));
      const TcpStoreOptions client = testing::loopbackClientOptions(server_->port(), secret);
      connect_ = [client] { return std::make_shared<TcpStore>(client); };
    } else {
      CHORUS_REQUIRE_ETCD();
      etcd_ = std::make_unique<testing::EtcdProcess>();
      const std::string prefix =
          "/contract/" +
          std::string(::testing::UnitTest::GetInstance()->current_test_info()->name());
      const EtcdStoreOptions client = etcd_->options(prefix + "/");
      connect_ = [client] { return std::make_shared<EtcdStore>(client); };
    }
    store_ = connect_();
  }

  // A client of the same backing store (the same object for MemoryStore).
  std::shared_ptr<Store> connect() { return connect_(); }

  std::unique_ptr<testing::EtcdProcess> etcd_;
  std::unique_ptr<TcpStoreServer> server_;
  std::function<std::shared_ptr<Store>()> connect_;
  std::shared_ptr<Store> store_;
};

TEST_P(StoreContract, SetThenGetReturnsTheValue) {
  store_->set("a", Bytes{1, 2, 3});
  EXPECT_EQ(store_->get("a", kLong), (Bytes{1, 2, 3}));
  store_->setString("a", "replaced");
  EXPECT_EQ(connect()->getString("a", kLong), "replaced");
}

TEST_P(StoreContract, EveryByteValueAndTheEmptyValueRoundTrip) {
  Bytes all;
  for (int byte = 0; byte < 256; ++byte) all.push_back(static_cast<std::uint8_t>(byte));
  for (std::size_t size = 0; size < 5; ++size) {
    const Bytes value(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(size));
    store_->set("v", value);
    EXPECT_EQ(store_->get("v", kLong), value) << size << " bytes";
  }
  store_->set("all", all);
  EXPECT_EQ(store_->get("all", kLong), all);
  store_->set("empty", Bytes());
  EXPECT_TRUE(store_->check({"empty"}));
  EXPECT_EQ(store_->get("empty", kLong), Bytes());
}

TEST_P(StoreContract, AddCountsFromZeroAndStoresDecimalText) {
  EXPECT_EQ(store_->add("n", 3), 3);
  EXPECT_EQ(store_->add("n", -5), -2);
  EXPECT_EQ(store_->getString("n", kLong), "-2");
  store_->setString("n", "40");
  EXPECT_EQ(store_->add("n", 2), 42);
}

TEST_P(StoreContract, AddOnNonIntegerThrowsCommError) {
  store_->setString("n", "seven");
  EXPECT_THROW(store_->add("n", 1), CommError);
  EXPECT_EQ(store_->getString("n", kLong), "seven");
}

TEST_P(StoreContract, CompareSetSwapsOnlyOnMatch) {
  // Absent key: matches only an empty `expected`.
  EXPECT_EQ(store_->compareSet("k", toBytes("x"), toBytes("y")), Bytes());
  EXPECT_FALSE(store_->check({"k"}));
  EXPECT_EQ(store_->compareSet("k", Bytes(), toBytes("first")), toBytes("first"));
  EXPECT_EQ(store_->compareSet("k", Bytes(), toBytes("again")), toBytes("first"));
  EXPECT_EQ(store_->compareSet("k", toBytes("wrong"), toBytes("second")), toBytes("first"));
  EXPECT_EQ(store_->compareSet("k", toBytes("first"), toBytes("second")), toBytes("second"));
  EXPECT_EQ(store_->getString("k", kLong), "second");
}

TEST_P(StoreContract, CheckDeleteAndNumKeys) {
  store_->setString("a", "1");
  store_->setString("b", "2");
  EXPECT_TRUE(store_->check({"a", "b"}));
  EXPECT_FALSE(store_->check({"a", "c"}));
  EXPECT_EQ(store_->numKeys(), 2);
  EXPECT_TRUE(store_->deleteKey("a"));
  EXPECT_FALSE(store_->deleteKey("a"));
  EXPECT_FALSE(store_->check({"a"}));
  EXPECT_EQ(store_->numKeys(), 1);
}

TEST_P(StoreContract, WaitWakesWhenAnotherClientSetsTheLastKey) {
  store_->setString("a", "1");
  Stopwatch watch;
  std::thread setter([this] {
    std::this_thread::sleep_for(milliseconds(50));
    connect()->setString("b", "2");
  });
  store_->wait({"a", "b"}, kLong);
  setter.join();
  EXPECT_GE(watch.millis().count(), 40);
  EXPECT_LT(watch.millis().count(), 5000);
}

TEST_P(StoreContract, GetBlocksUntilAnotherClientSets) {
  std::thread setter([this] {
    std::this_thread::sleep_for(milliseconds(30));
    connect()->setString("late", "here");
  });
  EXPECT_EQ(store_->getString("late", kLong), "here");
  setter.join();
}

TEST_P(StoreContract, AThreadBlockedInGetOnItsOwnClientDoesNotHoldUpAnother) {
  std::thread waiter([this] { EXPECT_EQ(connect()->getString("late", kLong), "here"); });
  std::this_thread::sleep_for(milliseconds(30));
  Stopwatch watch;
  store_->setString("late", "here");
  EXPECT_LT(watch.millis().count(), 2000);
  waiter.join();
}

TEST_P(StoreContract, GetTimesOutWithTimeoutErrorNamingTheKey) {
  Stopwatch watch;
  try {
    store_->get("never", milliseconds(100));
    FAIL() << "get returned";
  } catch (const TimeoutError& error) {
    EXPECT_NE(error.message().find("'never'"), std::string::npos) << error.message();
  }
  EXPECT_GE(watch.millis().count(), 90);
  EXPECT_LT(watch.millis().count(), 2000);
}

TEST_P(StoreContract, WaitTimeoutNamesOnlyTheMissingKeys) {
  store_->setString("here", "1");
  try {
    store_->wait({"here", "gone"}, milliseconds(50));
    FAIL() << "wait returned";
  } catch (const TimeoutError& error) {
    EXPECT_NE(error.message().find("'gone'"), std::string::npos) << error.message();
    EXPECT_EQ(error.message().find("'here'"), std::string::npos) << error.message();
  }
}

TEST_P(StoreContract, NoTimeoutSpelledAsMaxDoesNotOverflow) {
  store_->setString("a", "1");
  EXPECT_EQ(store_->getString("a", milliseconds::max()), "1");
  store_->wait({"a"}, milliseconds::max());
}

TEST_P(StoreContract, ConcurrentAddsFromSeveralClientsGiveTheExactTotal) {
  constexpr int kThreads = 4;
  constexpr int kAdds = 100;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this, t] {
      const std::shared_ptr<Store> own = connect();
      for (int i = 0; i < kAdds; ++i) own->add("sum", t + 1);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(store_->add("sum", 0), kAdds * (1 + 2 + 3 + 4));
}

TEST_P(StoreContract, ConcurrentCompareSetsHaveExactlyOneWinner) {
  constexpr int kThreads = 4;
  std::vector<Bytes> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this, t, &results] {
      results[t] = connect()->compareSet("decision", Bytes(), toBytes(std::to_string(t)));
    });
  }
  for (auto& thread : threads) thread.join();
  const Bytes winner = store_->get("decision", kLong);
  for (const Bytes& result : results) EXPECT_EQ(result, winner);
}

INSTANTIATE_TEST_SUITE_P(EveryStore, StoreContract, ::testing::Values("memory", "tcp", "etcd"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace chorus::comm
