#include "simulate/sim_engine.h"

#include <algorithm>
#include <queue>

#include "chorus/core/error.h"

namespace chorus::plan::detail {

int SimEngine::add(SimTask task) {
  tasks_.push_back(std::move(task));
  out_.emplace_back();
  pending_.push_back(0);
  ready_.push_back(0);
  return static_cast<int>(tasks_.size()) - 1;
}

void SimEngine::depend(int after, int before, double fraction) {
  out_[before].push_back({after, fraction});
  ++pending_[after];
}

void SimEngine::run(int resources) {
  using Item = std::pair<double, int>;  // (ready time, task); ties by task id
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> queue;
  for (int id = 0; id < size(); ++id)
    if (pending_[id] == 0) queue.push({0.0, id});
  std::vector<double> free_at(resources, 0.0);
  int done = 0;
  while (!queue.empty()) {
    const auto [ready, id] = queue.top();
    queue.pop();
    SimTask& task = tasks_[id];
    double start = ready;
    for (int r : task.resources) start = std::max(start, free_at[r]);
    task.start = start;
    task.end = start + task.duration;
    for (int r : task.resources) free_at[r] = task.end;
    ++done;
    for (const Edge& edge : out_[id]) {
      ready_[edge.to] = std::max(ready_[edge.to], start + edge.fraction * task.duration);
      if (--pending_[edge.to] == 0) queue.push({ready_[edge.to], edge.to});
    }
  }
  if (done != size())
    CHORUS_THROW(Error, "simulator: ", size() - done, " of ", size(),
                 " tasks never became ready (dependency cycle)");
}

}  // namespace chorus::plan::detail
