// Private to runtime: what an elastic job's agent does when one of its workers ends on its own.
#pragma once

#include <map>
#include <set>
#include <vector>

#include "chorus/comm/store/store.h"
#include "chorus/runtime/launch/supervisor.h"

namespace chorus::runtime {

// Elastic jobs: what the agent does when one of its workers ends on its own. It tells the
// survivors of each lost worker through the job's store as soon as it is reaped, and then, while
// restarts remain (AgentOptions::max_restarts), starts a replacement under a new member id. A
// store that cannot be reached (node 0 gone) must not end the supervision of the others, nor
// must a replacement that cannot start. Lives on the supervisor's run() thread (its on_exit).
// Non-copyable; `store` must outlive it.
class ElasticLosses {
 public:
  // `world_size`: the job's launch world size, where replacements' member ids start.
  ElasticLosses(comm::Store& store, int world_size, int max_restarts)
      : store_(store), world_size_(world_size), max_restarts_(max_restarts) {}
  ElasticLosses(const ElasticLosses&) = delete;
  ElasticLosses& operator=(const ElasticLosses&) = delete;

  // Where replacements start, and the launches they copy. REQUIRES: before the first onExit().
  void attach(Supervisor& supervisor, const std::vector<WorkerLaunch>& launches);

  // SupervisorOptions::on_exit.
  void onExit(const WorkerExit& exit);

  // Ranks whose worker was lost and replaced.
  const std::set<int>& replaced() const { return replaced_; }

 private:
  void announce(const WorkerExit& exit);
  void restart(const WorkerExit& exit);

  comm::Store& store_;
  const int world_size_;
  const int max_restarts_;
  Supervisor* supervisor_ = nullptr;
  std::map<int, WorkerLaunch> launches_;  // by rank, replacements included
  std::set<int> replaced_;
  int restarts_ = 0;
};

}  // namespace chorus::runtime
