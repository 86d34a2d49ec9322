// Private to runtime: elastic recovery of ZeRO's slices from their replicas (zero.redundancy = 1,
// docs/elastic.md). Rank r of a world steps its own slice and a replica of its successor's, so a
// lost rank's slice survives on its predecessor. When a loss strikes, each survivor takes what it
// holds out of its engine (ZeroHolding); the new generation's members find, for every slice of
// the old world, a survivor holding it — the owner, else its predecessor — and cut the slices
// anew for themselves (one all-to-all per tensor), so the run goes on from the interrupted step
// without going back to a checkpoint. When two neighbours were lost, or the survivors' slices are
// not all of one step, nothing is restored and the caller goes back to the last checkpoint.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chorus/comm/communicator.h"
#include "chorus/parallel/zero.h"

namespace chorus::runtime {

// What one rank holds of a ZeRO world's slices: its own and (with redundancy) its successor's,
// each as "master" (the fp32 parameters) and the optimizer state by name. Value type; the
// tensors are copies, so the engine they came from may go.
struct ZeroHolding {
  std::vector<int> members;          // the world's member ids, in rank order
  std::vector<std::int64_t> bounds;  // its slices' bounds
  int rank = -1;                     // this rank in it
  std::int64_t progress = 0;         // the steps its slices have taken (its next step)
  std::map<std::string, at::Tensor> own, replica;
};

// The slices of `zero`, whose world is `members`, after `progress` steps.
ZeroHolding holdingOf(const parallel::ZeroOptimizer& zero, const std::vector<int>& members,
                      std::int64_t progress);

// What every member of the next generation needs from the source's holding: the old world, its
// bounds, the optimizer state's names and AdamW's step count.
nlohmann::json replicaHeader(const ZeroHolding& source);

// Collective over `world` (the members of the next generation, `members` in rank order): rebuilds
// `zero`'s slices (and replica) from the holders of the old world's slices at step `step`; the
// caller then rebuilds the parameters from them (ZeroOptimizer::gatherParameters). `mine` is this
// rank's holding (null for a joiner). Returns false, having changed nothing, when some slice has no
// complete holder at that step (every member decides alike); `why` then says why.
bool restoreFromReplicas(parallel::ZeroOptimizer& zero, comm::Communicator& world,
                         const nlohmann::json& header, const ZeroHolding* mine,
                         const std::vector<int>& members, std::int64_t step, std::string& why);

}  // namespace chorus::runtime
