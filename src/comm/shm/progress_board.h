// Private to comm: who has reached which operation.
//
// Each rank records the sequence number of the operation it last entered; a background thread
// publishes it to the group's store when it changed (at most every `interval`), so the hot path
// costs one atomic store. When an operation fails, behind(seq) reads every member's published
// number: the members still below `seq` are the ones that never arrived.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "chorus/comm/store/store.h"

namespace chorus::comm {

// Owns its publisher thread; enter() is lock-free and may be called from any thread.
class ProgressBoard {
 public:
  ProgressBoard(std::shared_ptr<Store> store, int rank, int size,
                std::chrono::milliseconds interval);
  ~ProgressBoard();
  ProgressBoard(const ProgressBoard&) = delete;
  ProgressBoard& operator=(const ProgressBoard&) = delete;

  void enter(long long sequence) { entered_.store(sequence, std::memory_order_relaxed); }
  // Group ranks whose published progress is below `sequence` (this rank excluded). Reads the
  // store with a short deadline; ranks whose progress cannot be read count as behind.
  std::vector<int> behind(long long sequence);

 private:
  void publishLoop();
  void publish();

  std::shared_ptr<Store> store_;
  int rank_;
  int size_;
  std::chrono::milliseconds interval_;
  std::atomic<long long> entered_{-1};
  long long published_ = -2;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace chorus::comm
