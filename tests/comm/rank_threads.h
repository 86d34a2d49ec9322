// Test helper: several ranks of one group as threads of this process, over one in-memory store.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "chorus/comm/communicator.h"
#include "chorus/comm/store/memory_store.h"

namespace chorus::comm::testing {

// Runs `body(communicator)` for ranks 0..size-1, each on its own thread; rethrows the first
// failure (by rank) after all threads ended.
inline void runRankThreads(int size, const std::function<void(std::shared_ptr<Communicator>)>& body,
                           CommOptions options = {}) {
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(size);
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(Communicator::create(store, rank, size, options));
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (auto& error : errors)
    if (error) std::rethrow_exception(error);
}

}  // namespace chorus::comm::testing
