// The key-value store that workers of one job meet through (rendezvous).
//
// Keys are strings, values byte strings. Blocking calls (get, wait) take a timeout and throw
// TimeoutError naming the keys that did not appear. Implementations: MemoryStore (threads of one
// process), TcpStore (a client of TcpStoreServer, authenticated by the job secret), EtcdStore (the
// job's keys in etcd, which no agent of the job hosts) and PrefixStore (a namespace inside another
// store). tests/comm/store/store_contract_test.cc holds every implementation to this contract. The
// c10d adapter (c10d_store.h) lets libtorch's process groups rendezvous through any of them.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chorus/core/clock.h"

namespace chorus::comm {

using Bytes = std::vector<std::uint8_t>;

Bytes toBytes(const std::string& text);
std::string toString(const Bytes& bytes);

// Formats keys for error messages: 'a', 'b' (the first few, then "and N more").
std::string describeKeys(const std::vector<std::string>& keys);

// A deadline `timeout` from now. A timeout too large to add to the clock (milliseconds::max(), how
// callers spell an explicit "no timeout") never expires.
Deadline deadlineFor(std::chrono::milliseconds timeout);

// Abstract store. All implementations are thread-safe: any number of threads may call any method
// concurrently. Not copyable; share it through std::shared_ptr.
class Store {
 public:
  Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;
  virtual ~Store() = default;

  // Sets `key` to `value`, replacing any previous value, and wakes waiters on `key`.
  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Returns the value of `key`, waiting up to `timeout` for it to be set. Throws TimeoutError.
  virtual Bytes get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Atomically adds `delta` to the integer stored at `key` (absent = 0) and returns the new value.
  // The value is kept as decimal text so get() returns e.g. "3".
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
  // Atomically: if the current value equals `expected` (an absent key equals an empty `expected`),
  // sets `desired`. Returns the value after the operation.
  virtual Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) = 0;
  // True when every key exists, without waiting.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Waits up to `timeout` until every key exists. Throws TimeoutError naming the missing keys.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // Removes `key`; returns whether it existed.
  virtual bool deleteKey(const std::string& key) = 0;
  // Number of keys currently stored.
  virtual std::int64_t numKeys() = 0;

  // Convenience wrappers for text values.
  void setString(const std::string& key, const std::string& value) { set(key, toBytes(value)); }
  std::string getString(const std::string& key, std::chrono::milliseconds timeout) {
    return toString(get(key, timeout));
  }
};

}  // namespace chorus::comm
