#include "chorus/comm/store/prefix_store.h"

#include <utility>

#include "chorus/core/error.h"

namespace chorus::comm {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
  CHORUS_CHECK_CONFIG(base_ != nullptr, "PrefixStore '", prefix_, "' needs a base store");
}

void PrefixStore::set(const std::string& key, const Bytes& value) { base_->set(join(key), value); }

Bytes PrefixStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  return base_->get(join(key), timeout);
}

std::int64_t PrefixStore::add(const std::string& key, std::int64_t delta) {
  return base_->add(join(key), delta);
}

Bytes PrefixStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  return base_->compareSet(join(key), expected, desired);
}

bool PrefixStore::check(const std::vector<std::string>& keys) { return base_->check(join(keys)); }

void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  base_->wait(join(keys), timeout);
}

bool PrefixStore::deleteKey(const std::string& key) { return base_->deleteKey(join(key)); }

std::int64_t PrefixStore::numKeys() { return base_->numKeys(); }

std::vector<std::string> PrefixStore::join(const std::vector<std::string>& keys) const {
  std::vector<std::string> joined;
  joined.reserve(keys.size());
  for (const std::string& key : keys) joined.push_back(join(key));
  return joined;
}

}  // namespace chorus::comm
