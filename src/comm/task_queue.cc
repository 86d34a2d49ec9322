#include "chorus/comm/task_queue.h"

#include "chorus/core/error.h"
#include "work_state.h"

namespace chorus::comm {
namespace {

// The transport-side handle of a task: what Work::wait() waits on. Completed by the helper thread.
class TaskWork : public c10d::Work {
 public:
  explicit TaskWork(std::string name) : name_(std::move(name)) {}

  void complete(std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(task_mutex_);
    error_ = std::move(error);
    done_ = true;
    done_signal_.notify_all();
  }

  bool isCompleted() override {
    std::lock_guard<std::mutex> lock(task_mutex_);
    return done_;
  }

  bool wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(task_mutex_);
    if (!done_signal_.wait_for(lock, timeout, [this] { return done_; }))
      CHORUS_THROW(TimeoutError, name_, " did not finish within ", timeout.count(), " ms");
    if (error_) std::rethrow_exception(error_);
    return true;
  }

  void abort() override {}  // the helper ends a task only at its own deadlines

 private:
  std::string name_;
  std::mutex task_mutex_;
  std::condition_variable done_signal_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace

struct TaskQueue::Item {
  std::function<void()> task;
  c10::intrusive_ptr<TaskWork> work;

  // The task's captures (tensors) go before its waiter learns it is done: the waiter then holds
  // the last references and frees them on its own thread, never the queue's afterwards.
  void finish(std::exception_ptr error) {
    task = nullptr;
    work->complete(std::move(error));
  }
};

TaskQueue::TaskQueue(std::string name, std::chrono::milliseconds task_timeout)
    : task_timeout_(task_timeout), group_(std::make_shared<GroupContext>()) {
  if (task_timeout.count() <= 0) CHORUS_THROW(ConfigError, "task queue: timeout must be > 0");
  group_->name = std::move(name);
  group_->stats = std::make_shared<CommStats>();
  thread_ = std::thread([this] { run(); });
}

TaskQueue::~TaskQueue() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

Work TaskQueue::submit(const std::string& operation, std::uint64_t bytes,
                       std::function<void()> task) {
  auto state = std::make_shared<Work::State>();
  state->group = group_;
  state->operation = operation;
  state->bytes = bytes;
  auto item = std::make_shared<Item>();
  item->task = std::move(task);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) CHORUS_THROW(CommError, "task queue '", group_->name, "' is shutting down");
    state->sequence = next_sequence_++;
    item->work = c10::make_intrusive<TaskWork>(
        detail::concat(operation, " #", state->sequence, " in '", group_->name, "'"));
    state->timeout = task_timeout_ * static_cast<long long>(queue_.size() + 1);
    queue_.push_back(item);
  }
  state->deadline = Deadline::after(state->timeout);
  state->work = item->work;
  wake_.notify_all();
  return Work(state);
}

void TaskQueue::run() {
  for (;;) {
    std::shared_ptr<Item> item;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      item = queue_.front();
      queue_.pop_front();
      if (stopping_) {
        // Tasks not started at shutdown fail rather than run: peers may already be gone.
        lock.unlock();
        item->finish(std::make_exception_ptr(
            CommError("task queue destroyed before the task ran", __FILE__, __LINE__)));
        continue;
      }
    }
    std::exception_ptr error;
    if (group_->broken.load()) {
      error = std::make_exception_ptr(CommError(
          detail::concat("task queue '", group_->name, "' is broken: an earlier task failed"),
          __FILE__, __LINE__));
    } else {
      try {
        item->task();
      } catch (...) {
        error = std::current_exception();
        group_->markBroken("task failed");
      }
    }
    item->finish(error);
  }
}

std::map<std::string, OpStats> TaskQueue::stats() const { return group_->stats->snapshot(); }

}  // namespace chorus::comm
