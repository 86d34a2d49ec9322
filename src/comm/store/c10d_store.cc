#include "chorus/comm/store/c10d_store.h"

#include <utility>

#include "chorus/core/error.h"

namespace chorus::comm {
namespace {

// c10d spells "wait forever" as a zero timeout; chorus stores spell it milliseconds::max().
std::chrono::milliseconds toChorusTimeout(std::chrono::milliseconds timeout) {
  return timeout == c10d::Store::kNoTimeout ? std::chrono::milliseconds::max() : timeout;
}

}  // namespace

C10dStoreAdapter::C10dStoreAdapter(std::shared_ptr<chorus::comm::Store> store,
                                   std::chrono::milliseconds timeout)
    : c10d::Store(timeout), store_(std::move(store)) {
  CHORUS_CHECK_CONFIG(store_ != nullptr, "C10dStoreAdapter needs a store");
}

c10::intrusive_ptr<c10d::Store> C10dStoreAdapter::clone() {
  return c10::make_intrusive<C10dStoreAdapter>(store_, timeout_);
}

void C10dStoreAdapter::set(const std::string& key, const std::vector<uint8_t>& value) {
  store_->set(key, value);
}

std::vector<uint8_t> C10dStoreAdapter::compareSet(const std::string& key,
                                                  const std::vector<uint8_t>& currentValue,
                                                  const std::vector<uint8_t>& newValue) {
  return store_->compareSet(key, currentValue, newValue);
}

std::vector<uint8_t> C10dStoreAdapter::get(const std::string& key) {
  return store_->get(key, toChorusTimeout(timeout_));
}

int64_t C10dStoreAdapter::add(const std::string& key, int64_t value) {
  return store_->add(key, value);
}

bool C10dStoreAdapter::deleteKey(const std::string& key) { return store_->deleteKey(key); }

bool C10dStoreAdapter::check(const std::vector<std::string>& keys) { return store_->check(keys); }

int64_t C10dStoreAdapter::getNumKeys() { return store_->numKeys(); }

void C10dStoreAdapter::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void C10dStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  store_->wait(keys, toChorusTimeout(timeout));
}

}  // namespace chorus::comm
