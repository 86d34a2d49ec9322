// The in-process store: a map guarded by one mutex, with a condition variable for waiters.
//
// Threads of one process rendezvous through it directly (tests run N ranks this way), and
// TcpStoreServer keeps the job's state in one, so the TCP store has exactly these semantics.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "chorus/comm/store/store.h"

namespace chorus::comm {

// A thread-safe in-memory Store. Owns its keys and values. All methods may be called concurrently
// from any number of threads; blocking calls wake as soon as another thread sets their keys.
//
// close() ends the store's life early: it wakes every blocked get/wait with CommError, and every
// later call throws CommError too. The TCP server uses it so that stopping never waits for a
// client's long get.
class MemoryStore : public Store {
 public:
  MemoryStore() = default;
  ~MemoryStore() override = default;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  // An absent key with a non-empty `expected` is left absent, and empty bytes are returned.
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool deleteKey(const std::string& key) override;
  std::int64_t numKeys() override;

  // Wakes all waiters with CommError and makes every later call throw CommError. Idempotent.
  void close();

  // Non-throwing forms of get and wait for callers that report timeouts themselves (the TCP
  // server replies TIMEOUT instead). getFor returns nullopt on timeout; waitFor returns the keys
  // still missing at the deadline (empty on success). Both throw CommError once closed.
  std::optional<Bytes> getFor(const std::string& key, std::chrono::milliseconds timeout);
  std::vector<std::string> waitFor(const std::vector<std::string>& keys,
                                   std::chrono::milliseconds timeout);

 private:
  // The helpers below REQUIRE mutex_ held.
  void throwIfClosed() const;
  std::vector<std::string> missingLocked(const std::vector<std::string>& keys) const;
  // Blocks until all `keys` exist or `timeout` passes; returns the keys still missing.
  std::vector<std::string> waitLocked(std::unique_lock<std::mutex>& lock,
                                      const std::vector<std::string>& keys,
                                      std::chrono::milliseconds timeout);

  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, Bytes> values_;
  bool closed_ = false;
};

}  // namespace chorus::comm
