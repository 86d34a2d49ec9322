#include "shm/progress_board.h"

#include <string>

#include "chorus/core/error.h"
#include "chorus/core/logging.h"

namespace chorus::comm {
namespace {

std::string keyOf(int rank) { return "progress/" + std::to_string(rank); }

}  // namespace

ProgressBoard::ProgressBoard(std::shared_ptr<Store> store, int rank, int size,
                             std::chrono::milliseconds interval)
    : store_(std::move(store)), rank_(rank), size_(size), interval_(interval) {
  thread_ = std::thread([this] { publishLoop(); });
}

ProgressBoard::~ProgressBoard() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void ProgressBoard::publish() {
  const long long now = entered_.load(std::memory_order_relaxed);
  if (now == published_) return;
  store_->setString(keyOf(rank_), std::to_string(now));
  published_ = now;
}

void ProgressBoard::publishLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, interval_);
    if (stop_) break;
    try {
      publish();
    } catch (const std::exception& error) {
      // The store going away ends the job soon anyway; progress is only a diagnostic.
      logDebug("progress publisher: ", error.what());
    }
  }
}

std::vector<int> ProgressBoard::behind(long long sequence) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      publish();
    } catch (const std::exception&) {
    }
  }
  std::vector<int> missing;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    long long reached = -1;
    try {
      if (store_->check({keyOf(peer)}))
        reached = std::stoll(store_->getString(keyOf(peer), std::chrono::milliseconds(2000)));
    } catch (const std::exception&) {
      reached = -1;
    }
    if (reached < sequence) missing.push_back(peer);
  }
  return missing;
}

}  // namespace chorus::comm
