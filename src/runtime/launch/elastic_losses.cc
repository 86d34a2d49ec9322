#include "launch/elastic_losses.h"

#include "chorus/core/logging.h"
#include "chorus/runtime/launch/agent.h"
#include "chorus/runtime/launch/identity.h"
#include "launch/node_rendezvous.h"

namespace chorus::runtime {

void ElasticLosses::attach(Supervisor& supervisor, const std::vector<WorkerLaunch>& launches) {
  supervisor_ = &supervisor;
  for (const WorkerLaunch& launch : launches) launches_.emplace(launch.rank, launch);
}

void ElasticLosses::onExit(const WorkerExit& exit) {
  if (exit.success() || exit.stopped) return;
  announce(exit);
  if (restarts_ < max_restarts_) restart(exit);
}

void ElasticLosses::announce(const WorkerExit& exit) {
  const std::string description = exit.describe();
  try {
    store_.setString(elasticExitKey(exit.rank), description);
  } catch (const std::exception& error) {
    logWarn("chorus run: cannot post the loss of rank ", exit.rank,
            " to the job's store: ", error.what());
  }
  logWarn("chorus run: lost ", description, ": elastic, the others go on");
}

void ElasticLosses::restart(const WorkerExit& exit) {
  WorkerLaunch launch = launches_.at(exit.rank);
  try {
    launch.rank = drawMemberId(store_, world_size_);
  } catch (const std::exception& error) {
    logWarn("chorus run: cannot restart rank ", exit.rank,
            ": no member id from the job's store: ", error.what());
    return;
  }
  launch.env[env::kRank] = std::to_string(launch.rank);
  // The launch rank whose device and place in the plan it takes: a replacement of a replacement
  // keeps the one its predecessor had. A worker of a node that joined later has no launch rank: its
  // replacement joins with a new device too (env::kElasticNewDevice, copied).
  if (launch.env.count(env::kElasticNewDevice) == 0)
    launch.env.emplace(env::kElasticReplaces, std::to_string(exit.rank));
  ++restarts_;
  logWarn("chorus run: restarting rank ", exit.rank, " as rank ", launch.rank, " (restart ",
          restarts_, " of ", max_restarts_, ")");
  try {
    if (!supervisor_->add(launch)) return;  // the agent is stopping every worker
  } catch (const std::exception& error) {
    logError("chorus run: cannot restart rank ", exit.rank, ": ", error.what());
    return;
  }
  replaced_.insert(exit.rank);
  launches_.emplace(launch.rank, std::move(launch));
}

}  // namespace chorus::runtime
