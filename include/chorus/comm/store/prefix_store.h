// A namespace inside another store.
//
// Each subsystem (a process group, a pipeline's stages, the elastic agent) gets its own prefix, so
// two of them can use the same key names in one job store without colliding.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "chorus/comm/store/store.h"

namespace chorus::comm {

// Maps every key to `prefix + "/" + key` in a base store, which it shares (the base lives as long
// as any PrefixStore on it). Thread-safe exactly as the base store is; holds no state of its own.
// Prefixes nest: PrefixStore("b", PrefixStore("a", s)) writes "a/b/key" into s.
class PrefixStore : public Store {
 public:
  // REQUIRES: `base` non-null (else ConfigError).
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool deleteKey(const std::string& key) override;
  // The base store's count, keys of every prefix included (as c10d's PrefixStore does): the
  // Store interface cannot list keys, and counting is only used for diagnostics.
  std::int64_t numKeys() override;

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<Store>& base() const { return base_; }

 private:
  std::string join(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> join(const std::vector<std::string>& keys) const;

  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace chorus::comm
