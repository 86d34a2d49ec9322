// Subgroups of a Communicator: any rank list, and the per-host / leaders split that hierarchical
// collectives build on.
#include <map>

#include "backend.h"
#include "chorus/comm/communicator.h"
#include "chorus/core/error.h"

namespace chorus::comm {

std::shared_ptr<Communicator> Communicator::subgroup(const std::vector<int>& ranks,
                                                     const std::string& name) {
  if (ranks.empty() || !std::is_sorted(ranks.begin(), ranks.end()) ||
      std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end())
    CHORUS_THROW(ConfigError, "subgroup '", name, "': ranks must be ascending and distinct");
  const auto self = std::find(ranks.begin(), ranks.end(), rank_);
  if (self == ranks.end())
    CHORUS_THROW(ConfigError, "subgroup '", name, "': rank ", rank_, " is not a member");
  CommOptions options = options_;
  options.name = options_.name + "/" + name;
  options.global_ranks.clear();
  for (int member : ranks) {
    if (member < 0 || member >= size_)
      CHORUS_THROW(ConfigError, "subgroup '", name, "': rank ", member, " is out of range");
    options.global_ranks.push_back(globalRank(member));
  }
  auto child = create(store_, static_cast<int>(self - ranks.begin()),
                      static_cast<int>(ranks.size()), options);
  std::lock_guard<std::mutex> lock(children_mutex_);
  children_.push_back(child);
  return child;
}

Communicator::HostGroups Communicator::splitByHost() {
  if (options_.host_id.empty())
    CHORUS_THROW(ConfigError, "group '", options_.name,
                 "': splitByHost needs CommOptions::host_id");
  const std::string round = "split/" + std::to_string(splits_++) + "/";
  group_store_->setString(round + std::to_string(rank_), options_.host_id);
  HostGroups groups;
  std::map<std::string, size_t> index_of_host;
  for (int peer = 0; peer < size_; ++peer) {
    const std::string host =
        group_store_->getString(round + std::to_string(peer), options_.timeout);
    auto found = index_of_host.find(host);
    if (found == index_of_host.end()) {
      found = index_of_host.emplace(host, groups.hosts.size()).first;
      groups.hosts.emplace_back();
    }
    groups.hosts[found->second].push_back(peer);
  }
  std::vector<int> leaders;
  size_t mine = 0;
  for (size_t host = 0; host < groups.hosts.size(); ++host) {
    leaders.push_back(groups.hosts[host].front());
    const auto& members = groups.hosts[host];
    if (std::find(members.begin(), members.end(), rank_) != members.end()) mine = host;
  }
  const std::string tag = round.substr(6, round.size() - 7);
  groups.local = subgroup(groups.hosts[mine], "host" + std::to_string(mine) + "." + tag);
  if (leaders[mine] == rank_) groups.leaders = subgroup(leaders, "leaders." + tag);
  return groups;
}

}  // namespace chorus::comm
