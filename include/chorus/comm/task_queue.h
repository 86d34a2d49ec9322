// A helper thread that runs multi-step communication tasks one after another, in the order they
// were submitted, and hands back a Work for each.
//
// Algorithms made of several dependent collectives (hierarchical all-reduce, compressed
// all-reduce) must issue their collectives in the same order on every rank and must not block the
// training thread. Each such algorithm owns one TaskQueue: the caller submits a task and goes on;
// the helper issues the task's collectives and waits for them, so the order of issue on every
// rank is the order of submission.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "chorus/comm/comm_stats.h"
#include "chorus/comm/work.h"

namespace chorus::comm {

struct GroupContext;

// Owns its helper thread (joined on destruction). submit() may be called from any one thread at a
// time; the returned Work handles may be waited from any thread. Non-copyable.
class TaskQueue {
 public:
  // `name` labels errors and statistics. `task_timeout` bounds one task: a Work's deadline is
  // task_timeout times (1 + the number of tasks queued ahead of it), since each task runs only
  // after those ahead. A task must bound its own blocking calls (Communicator operations do).
  TaskQueue(std::string name, std::chrono::milliseconds task_timeout);
  ~TaskQueue();
  TaskQueue(const TaskQueue&) = delete;
  TaskQueue& operator=(const TaskQueue&) = delete;

  // Queues `task` (named `operation`, moving `bytes` of payload, for statistics). Its exception,
  // if any, is rethrown by Work::wait(). After a task failed, later tasks fail at once with
  // CommError: the collectives of the ranks would no longer match.
  Work submit(const std::string& operation, std::uint64_t bytes, std::function<void()> task);

  // Totals per operation name of the tasks waited for.
  std::map<std::string, OpStats> stats() const;

 private:
  struct Item;
  void run();

  std::chrono::milliseconds task_timeout_;
  std::shared_ptr<GroupContext> group_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Item>> queue_;
  bool stopping_ = false;
  long long next_sequence_ = 0;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace chorus::comm
