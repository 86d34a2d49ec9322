// What MemoryStore and PrefixStore add to the contract every Store keeps
// (store_contract_test.cc, which runs it against MemoryStore too).
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
