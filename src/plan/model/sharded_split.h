// Private to plan: a rank's ZeRO memory as the shard sizing sees it — linear in its fraction of
// the sharded state and in the fraction of it it keeps as a replica of its successor's slice.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "chorus/plan/memory_model.h"

namespace chorus::plan {

// Bytes of rank r at shard fraction f and replica fraction g:
// fixed[r] + f · sharded + g · replica[r]. Value type.
struct ShardedSplit {
  std::vector<double> fixed;    // per rank: replicated state and activations
  double sharded = 0;           // the whole sharded state, the same on every rank
  std::vector<double> replica;  // per rank: a whole replica (0 below ZeRO stage 1)
};

// The split of each rank's request (its shard and replica fractions are ignored).
ShardedSplit splitShardedState(const MemoryModel& memory, std::vector<StageMemoryRequest> requests);

// A split, and what each rank's usable bytes leave for the sharded state (and a replica) once
// its fixed part is held.
struct ShardedHeadroom {
  ShardedSplit split;
  std::vector<double> headroom;
};

// For sizing shards by memory: the split of `requests` and each rank's headroom in `usable`.
// Throws ConfigError unless there is one request, capacity and name per rank, and one naming the
// rank (by names[r]) that cannot hold even its fixed part.
ShardedHeadroom shardedHeadroom(const MemoryModel& memory, std::vector<StageMemoryRequest> requests,
                                const std::vector<double>& usable,
                                const std::vector<std::string>& names);

}  // namespace chorus::plan
