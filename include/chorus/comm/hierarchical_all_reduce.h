// Hierarchical all-reduce: an all-reduce that uses the fast links inside groups of ranks (a host,
// one vendor's devices) and crosses the slow links between groups as little as possible.
//
// Algorithms (Horovod's hierarchical all-reduce and NCCL's 2-D ring follow the same ideas):
//   flat          one all-reduce over all ranks.
//   hierarchical  reduce inside each group to its leader, all-reduce among the leaders, broadcast
//                 inside each group. Only leaders cross the slow links, each with the whole
//                 buffer; best for small buffers (3 latency steps, few messages on the network).
//   2d            reduce-scatter inside each group, all-reduce of each shard across the groups
//                 among the shard's owners, all-gather inside each group. Every rank carries 1/m
//                 of the buffer across the slow links (m = the largest group): best for large
//                 buffers.
// Groups may be uneven. The 2-D form cuts the buffer into m shards; in a group of s < m ranks,
// local rank j owns the contiguous shards [ceil(j m / s), ceil((j+1) m / s)), so a shard whose
// "own" owner (local index = shard index) is missing in a small group falls back to the rank that
// holds that part of the buffer there. The shard's cross-group all-reduce runs among its owners,
// one per group; shards with the same owners share one group.
//
// Every rank ends with bitwise the same result: each element is reduced once, by one collective,
// and then copied to everyone.
//
// The bridge: groups may hold different devices (an NVIDIA group, an AMD group, CPU ranks). Each
// group reduces inside with its native backend (NCCL, RCCL, shm or Gloo, chosen by the tensor's
// device), and where the topology is not native a tensor that lives on a device crosses between
// groups staged in pinned host memory, so the leaders (or the 2-D form's shard owners) meet over
// shm or Gloo whatever their devices. In a native topology they meet on their devices. A topology
// that is not native (Topology::native(): vendors differ, or ranks share a GPU) is never reduced by
// the flat form under kAuto; every group must hold ranks of one vendor.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "chorus/comm/communicator.h"
#include "chorus/comm/task_queue.h"
#include "chorus/comm/topology.h"
#include "chorus/core/collective_kinds.h"

namespace chorus::comm {

// The algorithms are core's vocabulary (core/collective_kinds.h), shared with the plan; these
// keep the comm:: spelling of the call sites that name them through this layer.
using chorus::AllReduceAlgorithm;
using chorus::parseAllReduceAlgorithm;

struct HierarchicalOptions {
  // Algorithm for every call. Default: kAuto (flat when the topology has no useful hierarchy,
  // else hierarchical below `two_d_min_bytes`, 2-D from there on).
  AllReduceAlgorithm algorithm = AllReduceAlgorithm::kAuto;
  // kAuto switches from hierarchical to 2-D at this buffer size. Default: 1 MiB: below it the
  // latency of the 2-D form's many shard messages outweighs the bytes it saves.
  std::int64_t two_d_min_bytes = 1ll << 20;
  // Bounds one call of the multi-phase algorithm (its phases are bound by the communicator's own
  // deadlines; this bounds the wait on the handle). Default: 3 x 60 s (three phases, each at most
  // the communicator's default timeout).
  std::chrono::milliseconds timeout{180000};
  // Prefix of the subgroups' names; two instances on one communicator need different names.
  // Default: "hier".
  std::string name = "hier";
};

// Replaces the all-reduce among leaders in the hierarchical form, e.g. by a compressed
// all-reduce for the slow link. Runs on the helper thread, on leaders only, with the leaders'
// group; must leave in `tensor` the SUM over leaders and issue the same collectives on every
// leader.
using LeaderReduce = std::function<void(at::Tensor& tensor, Communicator& leaders)>;

// Owns the subgroups it creates and a helper thread (TaskQueue) that runs the multi-phase forms.
// The constructor is collective over `world` (every rank calls it with the same topology and
// options). allReduce() is called from one thread at a time, in the same order on every rank;
// the flat form is issued on that thread on `world` itself, so it must not be used concurrently
// by another thread. Non-copyable.
class HierarchicalAllReduce {
 public:
  // Throws ConfigError when a group of `topology` mixes vendors.
  HierarchicalAllReduce(std::shared_ptr<Communicator> world, Topology topology,
                        HierarchicalOptions options = {});
  ~HierarchicalAllReduce();
  HierarchicalAllReduce(const HierarchicalAllReduce&) = delete;
  HierarchicalAllReduce& operator=(const HierarchicalAllReduce&) = delete;

  // In place; `tensor` must be contiguous and stay alive until the Work is waited. kAvg sums and
  // divides by the world size at the end. With `leader_reduce`, the hierarchical form is used
  // (the hook replaces its middle phase; a flat topology makes every rank a leader; it gets the
  // tensor in host memory). Throws ConfigError for the flat form on a device tensor over a
  // topology that is not native.
  Work allReduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum,
                 LeaderReduce leader_reduce = nullptr);

  // The algorithm a call on `bytes` bytes uses (never kAuto).
  AllReduceAlgorithm choose(std::int64_t bytes) const;

  const Topology& topology() const { return topology_; }
  // Bytes and time of the operations this rank issued, per operation and group ("local/...",
  // "leaders/...", "shard/...", "world/..."), for reports of what crossed which link.
  std::map<std::string, OpStats> stats() const;
  // How this rank's CPU tensors travel in each phase it takes part in: "local" (inside its group)
  // and "leaders" (between groups, as a leader), each "shm" or "gloo"; for logs and tests.
  std::string describeTransports() const;

 private:
  void runHierarchical(at::Tensor tensor, ReduceOp op, const LeaderReduce& leader_reduce);
  void runTwoD(at::Tensor tensor, ReduceOp op);
  std::vector<std::int64_t> shardBounds(std::int64_t numel) const;

  std::shared_ptr<Communicator> world_;
  Topology topology_;
  HierarchicalOptions options_;
  int rank_;
  std::shared_ptr<Communicator> local_;    // this rank's group
  std::shared_ptr<Communicator> leaders_;  // null unless this rank leads its group
  // Shard s of the 2-D form is all-reduced over shard_groups_[shard_group_of_[s]], which is null
  // on ranks that do not own shard s.
  std::vector<int> shard_group_of_;
  std::vector<std::shared_ptr<Communicator>> shard_groups_;
  // The contiguous shard range [first, last) each local index of this rank's group owns.
  std::vector<std::pair<int, int>> owned_shards_;
  std::unique_ptr<TaskQueue> queue_;
};

}  // namespace chorus::comm
