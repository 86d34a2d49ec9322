// C10dStoreAdapter: libtorch's c10d::Store interface served by chorus stores, in memory and TCP.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "chorus/comm/store/c10d_store.h"
#include "chorus/comm/store/memory_store.h"
#include "chorus/comm/store/tcp_store.h"
#include "chorus/core/clock.h"
#include "chorus/core/error.h"

namespace chorus::comm {
namespace {

using std::chrono::milliseconds;

// Exercises the adapter through the c10d::Store base, as ProcessGroupGloo does.
void checkEveryOperation(c10d::Store& store) {
  store.set("text", std::string("hello"));
  EXPECT_EQ(store.get_to_str("text"), "hello");
  store.set("bytes", std::vector<uint8_t>{1, 2, 3});
  EXPECT_EQ(store.get("bytes"), (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_EQ(store.add("counter", 2), 2);
  EXPECT_EQ(store.add("counter", 3), 5);
  EXPECT_EQ(store.get_to_str("counter"), "5");
  EXPECT_EQ(store.compareSet("cas", std::string(), std::string("one")), "one");
  EXPECT_EQ(store.compareSet("cas", std::string("two"), std::string("three")), "one");
  EXPECT_TRUE(store.check({"text", "bytes", "counter", "cas"}));
  EXPECT_FALSE(store.check({"text", "absent"}));
  EXPECT_EQ(store.getNumKeys(), 4);
  store.wait({"text", "counter"});
  store.wait({"text"}, milliseconds(100));
  EXPECT_TRUE(store.deleteKey("cas"));
  EXPECT_FALSE(store.deleteKey("cas"));
  EXPECT_EQ(store.getNumKeys(), 3);
}

// get() and wait(keys) must honour the c10d timeout rather than block forever.
void checkTimeouts(c10d::Store& store) {
  store.setTimeout(milliseconds(150));
  Stopwatch watch;
  EXPECT_THROW(store.get("never"), TimeoutError);
  EXPECT_GE(watch.millis().count(), 140);
  EXPECT_LT(watch.millis().count(), 3000);
  watch.reset();
  EXPECT_THROW(store.wait({"never"}), TimeoutError);
  EXPECT_LT(watch.millis().count(), 3000);
  EXPECT_THROW(store.wait({"never"}, milliseconds(50)), TimeoutError);
}

TEST(C10dStoreAdapter, EveryOperationOverMemoryStore) {
  auto adapter = c10::make_intrusive<C10dStoreAdapter>(std::make_shared<MemoryStore>());
  checkEveryOperation(*adapter);
  checkTimeouts(*adapter);
}

TEST(C10dStoreAdapter, EveryOperationOverTcpStore) {
  TcpStoreServerOptions server_options;
  server_options.host = "127.0.0.1";
  server_options.secret = JobSecret::fromText("c10d-adapter-test-secret");
  TcpStoreServer server(server_options);
  TcpStoreOptions options;
  options.port = server.port();
  options.secret = server_options.secret;
  auto adapter = c10::make_intrusive<C10dStoreAdapter>(std::make_shared<TcpStore>(options));
  checkEveryOperation(*adapter);
  checkTimeouts(*adapter);
}

TEST(C10dStoreAdapter, GetWaitsForASetThroughAClone) {
  auto adapter =
      c10::make_intrusive<C10dStoreAdapter>(std::make_shared<MemoryStore>(), milliseconds(10000));
  c10::intrusive_ptr<c10d::Store> clone = adapter->clone();
  EXPECT_EQ(clone->getTimeout(), milliseconds(10000));
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(50));
    clone->set("late", std::string("value"));
  });
  EXPECT_EQ(adapter->get_to_str("late"), "value");
  setter.join();
}

// c10d's own barrier() where the Store has one (PyTorch 2.15 has, 2.11 has not), else the
// add-and-wait protocol that barrier() implements, run by hand: either way through the adapter's
// add and wait.
template <typename Store>
void barrier(Store& store, const std::string& key, std::int64_t world_size) {
  if constexpr (requires { store.barrier(key, world_size); }) {
    store.barrier(key, world_size);
  } else {
    if (store.add(key + "/num_members", 1) == world_size)
      store.set(key + "/last_member", std::vector<uint8_t>{'1'});
    store.wait({key + "/last_member"});
  }
}

TEST(C10dStoreAdapter, BarrierOfThreeRanksCompletes) {
  auto base = std::make_shared<MemoryStore>();
  std::atomic<int> passed{0};
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 3; ++rank) {
    ranks.emplace_back([base, &passed] {
      auto store = c10::make_intrusive<C10dStoreAdapter>(base, milliseconds(10000));
      barrier(*store, "b", 3);
      ++passed;
    });
  }
  for (auto& rank : ranks) rank.join();
  EXPECT_EQ(passed.load(), 3);
}

TEST(C10dStoreAdapter, NoTimeoutMeansWaitUntilSet) {
  auto base = std::make_shared<MemoryStore>();
  auto adapter = c10::make_intrusive<C10dStoreAdapter>(base, c10d::Store::kNoTimeout);
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(50));
    base->setString("k", "v");
  });
  EXPECT_EQ(adapter->get_to_str("k"), "v");
  setter.join();
}

TEST(C10dStoreAdapter, NullStoreIsAConfigError) {
  EXPECT_THROW(C10dStoreAdapter(nullptr), ConfigError);
}

}  // namespace
}  // namespace chorus::comm
