// Lets libtorch's process groups (ProcessGroupGloo, ProcessGroupNCCL) rendezvous through a chorus
// store, so a job has one store, one secret and one set of timeouts.
//
// The only store header that includes libtorch; everything else in the store family is plain C++.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "chorus/comm/store/store.h"

namespace chorus::comm {

// A c10d::Store that forwards every call to a shared chorus Store. Shares ownership of that store
// with the caller and with its clones. Thread-safe as the wrapped store is. get() and wait(keys)
// use the c10d timeout (getTimeout(), set by the constructor or setTimeout()); c10d's kNoTimeout
// (zero) means no deadline, as c10d defines it. Errors are chorus errors (TimeoutError, CommError,
// ...), which c10d passes through to its caller.
class C10dStoreAdapter : public c10d::Store {
 public:
  // REQUIRES: `store` non-null (else ConfigError). Default timeout: c10d's, 300 s.
  explicit C10dStoreAdapter(std::shared_ptr<chorus::comm::Store> store,
                            std::chrono::milliseconds timeout = kDefaultTimeout);

  c10::intrusive_ptr<c10d::Store> clone() override;

  using c10d::Store::compareSet;
  using c10d::Store::set;
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& currentValue,
                                  const std::vector<uint8_t>& newValue) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  const std::shared_ptr<chorus::comm::Store>& store() const { return store_; }

 private:
  std::shared_ptr<chorus::comm::Store> store_;
};

}  // namespace chorus::comm
