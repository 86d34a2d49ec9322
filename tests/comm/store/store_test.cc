// MemoryStore and PrefixStore semantics: the contract every Store implementation keeps.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "chorus/comm/store/memory_store.h"
#include "chorus/comm/store/prefix_store.h"
#include "chorus/core/clock.h"
#include "chorus/core/error.h"

namespace chorus::comm {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kLong{10000};

TEST(MemoryStore, SetThenGetReturnsTheValue) {
  MemoryStore store;
  store.set("a", Bytes{1, 2, 3});
  EXPECT_EQ(store.get("a", kLong), (Bytes{1, 2, 3}));
  store.setString("a", "replaced");
  EXPECT_EQ(store.getString("a", kLong), "replaced");
}

TEST(MemoryStore, AddCountsFromZeroAndStoresDecimalText) {
  MemoryStore store;
  EXPECT_EQ(store.add("n", 3), 3);
  EXPECT_EQ(store.add("n", -5), -2);
  EXPECT_EQ(store.getString("n", kLong), "-2");
  store.setString("n", "40");
  EXPECT_EQ(store.add("n", 2), 42);
}

TEST(MemoryStore, AddOnNonIntegerThrowsCommError) {
  MemoryStore store;
  store.setString("n", "seven");
  EXPECT_THROW(store.add("n", 1), CommError);
  EXPECT_EQ(store.getString("n", kLong), "seven");
}

TEST(MemoryStore, CompareSetSwapsOnlyOnMatch) {
  MemoryStore store;
  // Absent key: matches only an empty `expected`.
  EXPECT_EQ(store.compareSet("k", toBytes("x"), toBytes("y")), Bytes());
  EXPECT_FALSE(store.check({"k"}));
  EXPECT_EQ(store.compareSet("k", Bytes(), toBytes("first")), toBytes("first"));
  EXPECT_EQ(store.compareSet("k", toBytes("wrong"), toBytes("second")), toBytes("first"));
  EXPECT_EQ(store.compareSet("k", toBytes("first"), toBytes("second")), toBytes("second"));
  EXPECT_EQ(store.getString("k", kLong), "second");
}

TEST(MemoryStore, CheckDeleteAndNumKeys) {
  MemoryStore store;
  store.setString("a", "1");
  store.setString("b", "2");
  EXPECT_TRUE(store.check({"a", "b"}));
  EXPECT_FALSE(store.check({"a", "c"}));
  EXPECT_EQ(store.numKeys(), 2);
  EXPECT_TRUE(store.deleteKey("a"));
  EXPECT_FALSE(store.deleteKey("a"));
  EXPECT_EQ(store.numKeys(), 1);
}

TEST(MemoryStore, WaitWakesWhenAnotherThreadSetsTheLastKey) {
  MemoryStore store;
  store.setString("a", "1");
  Stopwatch watch;
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(50));
    store.setString("b", "2");
  });
  store.wait({"a", "b"}, kLong);
  setter.join();
  EXPECT_GE(watch.millis().count(), 40);
  EXPECT_LT(watch.millis().count(), 5000);
}

TEST(MemoryStore, GetBlocksUntilSet) {
  MemoryStore store;
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(30));
    store.setString("late", "here");
  });
  EXPECT_EQ(store.getString("late", kLong), "here");
  setter.join();
}

TEST(MemoryStore, GetTimesOutWithTimeoutErrorNamingTheKey) {
  MemoryStore store;
  Stopwatch watch;
  try {
    store.get("never", milliseconds(100));
    FAIL() << "get returned";
  } catch (const TimeoutError& error) {
    EXPECT_NE(error.message().find("'never'"), std::string::npos) << error.message();
  }
  EXPECT_GE(watch.millis().count(), 90);
  EXPECT_LT(watch.millis().count(), 2000);
}

TEST(MemoryStore, WaitTimeoutNamesOnlyTheMissingKeys) {
  MemoryStore store;
  store.setString("here", "1");
  try {
    store.wait({"here", "gone"}, milliseconds(50));
    FAIL() << "wait returned";
  } catch (const TimeoutError& error) {
    EXPECT_NE(error.message().find("1 of 2 keys missing: 'gone'"), std::string::npos)
        << error.message();
  }
}

TEST(MemoryStore, CloseWakesBlockedGetWithCommError) {
  MemoryStore store;
  std::thread closer([&] {
    std::this_thread::sleep_for(milliseconds(30));
    store.close();
  });
  Stopwatch watch;
  EXPECT_THROW(store.get("never", kLong), CommError);
  closer.join();
  EXPECT_LT(watch.millis().count(), 5000);
  EXPECT_THROW(store.setString("a", "b"), CommError);
}

TEST(MemoryStore, NoTimeoutSpelledAsMaxDoesNotOverflow) {
  MemoryStore store;
  store.setString("a", "1");
  EXPECT_EQ(store.getString("a", milliseconds::max()), "1");
  store.wait({"a"}, milliseconds::max());
}

TEST(MemoryStore, ConcurrentAddsGiveExactTotal) {
  MemoryStore store;
  constexpr int kThreads = 8;
  constexpr int kAdds = 1000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&store, t] {
      for (int i = 0; i < kAdds; ++i) store.add("sum", t);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(store.add("sum", 0), kAdds * (0 + 1 + 2 + 3 + 4 + 5 + 6 + 7));
}

TEST(PrefixStore, KeysLandUnderThePrefixInTheBase) {
  auto base = std::make_shared<MemoryStore>();
  PrefixStore store("group0", base);
  store.setString("k", "v");
  EXPECT_EQ(base->getString("group0/k", kLong), "v");
  EXPECT_EQ(store.getString("k", kLong), "v");
  EXPECT_FALSE(base->check({"k"}));
  EXPECT_TRUE(store.check({"k"}));
}

TEST(PrefixStore, TwoPrefixesDoNotCollide) {
  auto base = std::make_shared<MemoryStore>();
  PrefixStore a("a", base);
  PrefixStore b("b", base);
  EXPECT_EQ(a.add("count", 2), 2);
  EXPECT_EQ(b.add("count", 5), 5);
  EXPECT_EQ(a.add("count", 1), 3);
  EXPECT_EQ(base->getString("a/count", kLong), "3");
  EXPECT_EQ(base->getString("b/count", kLong), "5");
  EXPECT_EQ(a.numKeys(), 2);  // the base's count, as documented
}

TEST(PrefixStore, NestsAndForwardsEveryOperation) {
  auto base = std::make_shared<MemoryStore>();
  auto outer = std::make_shared<PrefixStore>("job", base);
  PrefixStore inner("stage", outer);
  EXPECT_EQ(inner.compareSet("x", Bytes(), toBytes("1")), toBytes("1"));
  EXPECT_EQ(base->getString("job/stage/x", kLong), "1");
  EXPECT_TRUE(inner.deleteKey("x"));
  EXPECT_FALSE(base->check({"job/stage/x"}));
}

TEST(PrefixStore, WaitWakesOnSetThroughAnotherPrefixStore) {
  auto base = std::make_shared<MemoryStore>();
  PrefixStore waiter("p", base);
  PrefixStore setter("p", base);
  std::thread thread([&] {
    std::this_thread::sleep_for(milliseconds(30));
    setter.setString("ready", "1");
  });
  waiter.wait({"ready"}, kLong);
  thread.join();
  EXPECT_EQ(waiter.getString("ready", kLong), "1");
}

TEST(PrefixStore, TimeoutNamesThePrefixedKey) {
  PrefixStore store("p", std::make_shared<MemoryStore>());
  Stopwatch watch;
  try {
    store.get("missing", milliseconds(50));
    FAIL() << "get returned";
  } catch (const TimeoutError& error) {
    EXPECT_NE(error.message().find("'p/missing'"), std::string::npos) << error.message();
  }
  EXPECT_LT(watch.millis().count(), 2000);
}

TEST(PrefixStore, NullBaseIsAConfigError) { EXPECT_THROW(PrefixStore("p", nullptr), ConfigError); }

}  // namespace
}  // namespace chorus::comm
