// The simulator's event engine: tasks with durations, dependencies (possibly on a fraction of
// another task, for gradient buckets that become ready during a backward pass) and exclusive
// resources (links). Tasks start in the order they become ready; a task holding resources waits
// until all of them are free, and then holds them for its whole duration.
#pragma once

#include <string>
#include <vector>

namespace chorus::plan::detail {

struct SimTask {
  std::string name;
  std::string category;
  int rank = 0;  // the track it is shown on
  double duration = 0;
  std::vector<int> resources;
  // Filled by the engine.
  double start = -1;
  double end = -1;
};

// Not thread-safe; build, run once, read.
class SimEngine {
 public:
  // Adds a task and returns its id.
  int add(SimTask task);
  // `after` may start once `before` has run `fraction` of its duration. Default: all of it.
  void depend(int after, int before, double fraction = 1.0);
  // Runs every task. Throws Error if some never become ready (a cycle: a bug in the graph).
  void run(int resources);

  const SimTask& task(int id) const { return tasks_[id]; }
  int size() const { return static_cast<int>(tasks_.size()); }

 private:
  struct Edge {
    int to;
    double fraction;
  };
  std::vector<SimTask> tasks_;
  std::vector<std::vector<Edge>> out_;
  std::vector<int> pending_;
  std::vector<double> ready_;
};

}  // namespace chorus::plan::detail
