#include "chorus/comm/store/memory_store.h"

#include <cerrno>
#include <cstdlib>

#include "chorus/core/error.h"

namespace chorus::comm {
namespace {

std::int64_t parseCounter(const std::string& key, const Bytes& value) {
  std::string text = toString(value);
  errno = 0;
  char* end = nullptr;
  long long parsed = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE) {
    CHORUS_THROW(CommError, "store add: the value of key '", key,
                 "' is not a 64-bit decimal integer");
  }
  return parsed;
}

}  // namespace

void MemoryStore::set(const std::string& key, const Bytes& value) {
  std::lock_guard<std::mutex> lock(mutex_);
  throwIfClosed();
  values_[key] = value;
  changed_.notify_all();
}

Bytes MemoryStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::optional<Bytes> value = getFor(key, timeout);
  if (!value) {
    CHORUS_THROW(TimeoutError, "store get timed out after ", timeout.count(),
                 " ms waiting for key '", key, "'");
  }
  return std::move(*value);
}

std::optional<Bytes> MemoryStore::getFor(const std::string& key,
                                         std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!waitLocked(lock, {key}, timeout).empty()) return std::nullopt;
  return values_.at(key);
}

std::int64_t MemoryStore::add(const std::string& key, std::int64_t delta) {
  std::lock_guard<std::mutex> lock(mutex_);
  throwIfClosed();
  auto it = values_.find(key);
  std::int64_t current = it == values_.end() ? 0 : parseCounter(key, it->second);
  std::int64_t result = 0;
  if (__builtin_add_overflow(current, delta, &result)) {
    CHORUS_THROW(CommError, "store add: key '", key, "' would overflow a 64-bit integer");
  }
  values_[key] = toBytes(std::to_string(result));
  changed_.notify_all();
  return result;
}

Bytes MemoryStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  std::lock_guard<std::mutex> lock(mutex_);
  throwIfClosed();
  auto it = values_.find(key);
  bool matches = it == values_.end() ? expected.empty() : it->second == expected;
  if (matches) {
    values_[key] = desired;
    changed_.notify_all();
    return desired;
  }
  return it == values_.end() ? Bytes() : it->second;
}

bool MemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  throwIfClosed();
  return missingLocked(keys).empty();
}

void MemoryStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::vector<std::string> missing = waitFor(keys, timeout);
  if (!missing.empty()) {
    CHORUS_THROW(TimeoutError, "store wait timed out after ", timeout.count(), " ms; ",
                 missing.size(), " of ", keys.size(), " keys missing: ", describeKeys(missing));
  }
}

std::vector<std::string> MemoryStore::waitFor(const std::vector<std::string>& keys,
                                              std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  return waitLocked(lock, keys, timeout);
}

bool MemoryStore::deleteKey(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  throwIfClosed();
  return values_.erase(key) > 0;
}

std::int64_t MemoryStore::numKeys() {
  std::lock_guard<std::mutex> lock(mutex_);
  throwIfClosed();
  return static_cast<std::int64_t>(values_.size());
}

void MemoryStore::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
  changed_.notify_all();
}

void MemoryStore::throwIfClosed() const {
  if (closed_) CHORUS_THROW(CommError, "the store has been closed");
}

std::vector<std::string> MemoryStore::missingLocked(const std::vector<std::string>& keys) const {
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    if (values_.count(key) == 0) missing.push_back(key);
  }
  return missing;
}

std::vector<std::string> MemoryStore::waitLocked(std::unique_lock<std::mutex>& lock,
                                                 const std::vector<std::string>& keys,
                                                 std::chrono::milliseconds timeout) {
  Deadline deadline = deadlineFor(timeout);
  auto ready = [&] { return closed_ || missingLocked(keys).empty(); };
  if (deadline.when() == Clock::time_point::max()) {
    changed_.wait(lock, ready);
  } else {
    changed_.wait_until(lock, deadline.when(), ready);
  }
  throwIfClosed();
  return missingLocked(keys);
}

}  // namespace chorus::comm
