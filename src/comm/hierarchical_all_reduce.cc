#include "chorus/comm/hierarchical_all_reduce.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "chorus/core/error.h"

namespace chorus::comm {
namespace {

// Averages are sums divided once at the end: every phase sums.
ReduceOp phaseOp(ReduceOp op) { return op == ReduceOp::kAvg ? ReduceOp::kSum : op; }

int ceilDiv(long long a, long long b) { return static_cast<int>((a + b - 1) / b); }

// The rank of a group of `size` that owns shard `shard` of `shards` (see the header).
int shardOwner(int shard, int size, int shards) {
  return static_cast<int>(static_cast<long long>(shard) * size / shards);
}

void addStats(std::map<std::string, OpStats>& into, const std::string& prefix,
              const std::map<std::string, OpStats>& from) {
  for (const auto& [op, stats] : from) {
    OpStats& total = into[prefix + op];
    total.count += stats.count;
    total.bytes += stats.bytes;
    total.seconds += stats.seconds;
    total.failures += stats.failures;
  }
}

// What the phases between groups work on: `part` itself in a native topology (NCCL leaders of
// one vendor meet on their devices) or on the CPU; else the bridge, a copy staged in pinned host
// memory, where every group's leader can meet the others over shm or Gloo.
at::Tensor acrossGroups(const at::Tensor& part, const Topology& topology) {
  if (part.is_cpu() || topology.native()) return part;
  at::Tensor host = at::empty(part.sizes(), part.options().device(at::kCPU).pinned_memory(true));
  host.copy_(part);
  return host;
}

// Copies a staged result back to its device (nothing when `part` was on the CPU).
void backFromHost(at::Tensor& part, const at::Tensor& host) {
  if (!part.is_same(host)) part.copy_(host);
}

// Throws ConfigError when a group mixes vendors: its members could not share a native collective.
void checkGroupsNative(const Topology& topology) {
  for (const auto& members : topology.groups())
    for (int rank : members)
      if (topology.vendorOf(rank) != topology.vendorOf(members.front()))
        CHORUS_THROW(ConfigError, "hierarchical all-reduce: the group {", joinInts(members, ","),
                     "} mixes ", topology.vendorOf(members.front()), " and ",
                     topology.vendorOf(rank),
                     " ranks, which share no native collective; group them by host and vendor");
}

}  // namespace

HierarchicalAllReduce::HierarchicalAllReduce(std::shared_ptr<Communicator> world, Topology topology,
                                             HierarchicalOptions options)
    : world_(std::move(world)),
      topology_(std::move(topology)),
      options_(std::move(options)),
      rank_(world_->rank()) {
  if (topology_.size() != world_->size())
    CHORUS_THROW(ConfigError, "hierarchical all-reduce: topology of ", topology_.size(),
                 " ranks for a group of ", world_->size());
  checkGroupsNative(topology_);
  // Subgroups are created in one global order (local groups, leaders, shard groups), each rank
  // joining those it belongs to: creation is a rendezvous, and one order cannot deadlock.
  const int group = topology_.groupOf(rank_);
  const auto& members = topology_.group(group);
  if (members.size() > 1)
    local_ = world_->subgroup(members, options_.name + ".local" + std::to_string(group));
  const std::vector<int> leaders = topology_.leaders();
  if (leaders.size() > 1 && topology_.localIndex(rank_) == 0)
    leaders_ = world_->subgroup(leaders, options_.name + ".leaders");

  const int shards = topology_.largestGroup();
  std::vector<std::vector<int>> sets{leaders};  // set 0 is the leaders' group
  shard_groups_.push_back(leaders_);
  for (int shard = 0; shard < shards; ++shard) {
    std::vector<int> owners;
    for (const auto& each : topology_.groups())
      owners.push_back(each[shardOwner(shard, static_cast<int>(each.size()), shards)]);
    std::sort(owners.begin(), owners.end());
    auto found = std::find(sets.begin(), sets.end(), owners);
    if (found == sets.end()) {
      const bool member = std::binary_search(owners.begin(), owners.end(), rank_);
      shard_groups_.push_back(
          member && owners.size() > 1
              ? world_->subgroup(owners, options_.name + ".shard" + std::to_string(shard))
              : nullptr);
      sets.push_back(owners);
      found = sets.end() - 1;
    }
    // A set of one rank needs no all-reduce: mark it with a null group.
    shard_group_of_.push_back(static_cast<int>(found - sets.begin()));
  }
  const int size = static_cast<int>(members.size());
  for (int local = 0; local < size; ++local)
    owned_shards_.emplace_back(ceilDiv(static_cast<long long>(local) * shards, size),
                               ceilDiv(static_cast<long long>(local + 1) * shards, size));
  queue_ = std::make_unique<TaskQueue>(world_->name() + "/" + options_.name, options_.timeout);
}

HierarchicalAllReduce::~HierarchicalAllReduce() = default;

AllReduceAlgorithm HierarchicalAllReduce::choose(std::int64_t bytes) const {
  if (options_.algorithm != AllReduceAlgorithm::kAuto) return options_.algorithm;
  // Without a native world, even one-rank groups need the hierarchical form: it crosses between
  // them in host memory, where a flat all-reduce would hand a CUDA tensor to one backend and a
  // CPU tensor to another.
  if (topology_.isFlat())
    return topology_.native() ? AllReduceAlgorithm::kFlat : AllReduceAlgorithm::kHierarchical;
  return bytes < options_.two_d_min_bytes ? AllReduceAlgorithm::kHierarchical
                                          : AllReduceAlgorithm::kTwoD;
}

Work HierarchicalAllReduce::allReduce(at::Tensor& tensor, ReduceOp op, LeaderReduce leader_reduce) {
  if (!tensor.is_contiguous())
    CHORUS_THROW(ConfigError, "hierarchical all-reduce: tensor must be contiguous");
  if (tensor.numel() == 0) return Work();
  const auto bytes = static_cast<std::int64_t>(tensor.nbytes());
  const AllReduceAlgorithm algorithm =
      leader_reduce ? AllReduceAlgorithm::kHierarchical : choose(bytes);
  if (algorithm == AllReduceAlgorithm::kFlat) {
    if (!topology_.native() && !tensor.is_cpu())
      CHORUS_THROW(ConfigError, "hierarchical all-reduce: 'flat' cannot carry a ",
                   tensor.device().str(), " tensor over ", topology_.describe(),
                   ", whose ranks share no native collective; use auto, hierarchical or 2d");
    return world_->allReduce(tensor, op);
  }
  at::Tensor flat = tensor.view({-1});
  if (algorithm == AllReduceAlgorithm::kTwoD)
    return queue_->submit("all_reduce_2d", bytes, [this, flat, op] { runTwoD(flat, op); });
  return queue_->submit("all_reduce_hierarchical", bytes,
                        [this, flat, op, leader_reduce = std::move(leader_reduce)] {
                          runHierarchical(flat, op, leader_reduce);
                        });
}

void HierarchicalAllReduce::runHierarchical(at::Tensor flat, ReduceOp op,
                                            const LeaderReduce& leader_reduce) {
  const bool leader = topology_.localIndex(rank_) == 0;
  if (local_) {
    // A reduce to the leader: a reduce-scatter whose only non-empty chunk is the leader's.
    std::vector<std::int64_t> counts(local_->size(), 0);
    counts[0] = flat.numel();
    at::Tensor reduced = at::empty({leader ? flat.numel() : 0}, flat.options());
    local_->reduceScatterV(flat, reduced, counts, phaseOp(op)).wait();
    if (leader) flat.copy_(reduced);
  }
  if (leader && leaders_) {
    at::Tensor host = acrossGroups(flat, topology_);
    if (leader_reduce)
      leader_reduce(host, *leaders_);
    else
      leaders_->allReduce(host, phaseOp(op)).wait();
    backFromHost(flat, host);
  }
  if (local_) local_->broadcast(flat, 0).wait();
  if (op == ReduceOp::kAvg) flat.div_(topology_.size());
}

std::vector<std::int64_t> HierarchicalAllReduce::shardBounds(std::int64_t numel) const {
  const int shards = topology_.largestGroup();
  std::vector<std::int64_t> bounds;
  for (int shard = 0; shard <= shards; ++shard) bounds.push_back(numel * shard / shards);
  return bounds;
}

void HierarchicalAllReduce::runTwoD(at::Tensor flat, ReduceOp op) {
  const auto bounds = shardBounds(flat.numel());
  const int local_index = topology_.localIndex(rank_);
  std::vector<std::int64_t> counts;
  for (const auto& [first, last] : owned_shards_) counts.push_back(bounds[last] - bounds[first]);
  const auto [first, last] = owned_shards_[local_index];
  // This rank's part: reduced inside the group (or the tensor itself in a group of one).
  at::Tensor part = flat.narrow(0, bounds[first], counts[local_index]);
  if (local_) {
    part = at::empty({counts[local_index]}, flat.options());
    local_->reduceScatterV(flat, part, counts, phaseOp(op)).wait();
  }
  // Consecutive shards with the same owners go in one all-reduce (every owner holds both). They
  // cross between groups in host memory.
  at::Tensor host = acrossGroups(part, topology_);
  std::vector<Work> pending;
  for (int shard = first; shard < last;) {
    int end = shard + 1;
    while (end < last && shard_group_of_[end] == shard_group_of_[shard]) ++end;
    const auto& group = shard_groups_[shard_group_of_[shard]];
    const std::int64_t begin = bounds[shard] - bounds[first];
    const std::int64_t length = bounds[end] - bounds[shard];
    if (group && length > 0) {
      at::Tensor segment = host.narrow(0, begin, length);
      pending.push_back(group->allReduce(segment, phaseOp(op)));
    }
    shard = end;
  }
  for (auto& work : pending) work.wait();
  backFromHost(part, host);
  if (local_) local_->allGatherV(part, flat, counts).wait();
  if (op == ReduceOp::kAvg) flat.div_(topology_.size());
}

std::string HierarchicalAllReduce::describeTransports() const {
  std::string text = "local " + (local_ ? local_->cpuTransport() : std::string("none"));
  if (leaders_) text += std::string(", leaders ") + leaders_->cpuTransport();
  return text;
}

std::map<std::string, OpStats> HierarchicalAllReduce::stats() const {
  std::map<std::string, OpStats> totals;
  if (local_) addStats(totals, "local/", local_->stats());
  if (leaders_) addStats(totals, "leaders/", leaders_->stats());
  for (size_t index = 1; index < shard_groups_.size(); ++index)
    if (shard_groups_[index]) addStats(totals, "shard/", shard_groups_[index]->stats());
  addStats(totals, "task/", queue_->stats());
  return totals;
}

}  // namespace chorus::comm
