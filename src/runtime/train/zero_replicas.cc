#include "train/zero_replicas.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "chorus/core/error.h"
#include "chorus/core/logging.h"

namespace chorus::runtime {
namespace {

constexpr const char* kMaster = "master";
constexpr const char* kStep = "step";

struct Range {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const { return std::max<std::int64_t>(0, end - begin); }
};

Range intersect(Range a, Range b) { return {std::max(a.begin, b.begin), std::min(a.end, b.end)}; }

// How the old world's slices map onto the new one: which new rank sends each old slice, and
// which ranges each new rank needs (its slice, then its replica of its successor's).
struct Reshard {
  std::vector<std::int64_t> old_bounds;
  std::vector<int> holder;                 // per old slice: the new rank that sends it
  std::vector<std::vector<Range>> needed;  // per new rank

  Range oldSlice(int slice) const { return {old_bounds[slice], old_bounds[slice + 1]}; }
};

// A fingerprint of the world a holding was cut for: members agree on one old world or restore
// nothing.
std::int64_t fingerprintOf(const std::vector<int>& members,
                           const std::vector<std::int64_t>& bounds) {
  std::int64_t value = 17;
  for (int member : members) value = (value * 1000003 + member + 1) % 2147483647;
  for (std::int64_t bound : bounds) value = (value * 1000003 + bound + 1) % 2147483647;
  return value;
}

// Whether `mine` holds every tensor `names` lists, of its slice's and its replica's length (a
// world of one keeps no replica): a holder that could not send its pieces must not be chosen.
bool complete(const ZeroHolding& mine, const nlohmann::json& names) {
  const int ranks = static_cast<int>(mine.bounds.size()) - 1;
  const auto has = [&](const std::map<std::string, at::Tensor>& held, int slice,
                       const std::string& name) {
    const auto found = held.find(name);
    return found != held.end() &&
           found->second.numel() == mine.bounds[slice + 1] - mine.bounds[slice];
  };
  for (const auto& name : names) {
    if (!has(mine.own, mine.rank, name)) return false;
    if (ranks > 1 && !has(mine.replica, (mine.rank + 1) % ranks, name)) return false;
  }
  return true;
}

// Every new rank's (progress, fingerprint of its holding's world); -1s for a joiner, and for a
// holding that is not complete.
std::vector<std::int64_t> gatherProgress(comm::Communicator& world, const ZeroHolding* mine,
                                         const nlohmann::json& names) {
  at::Tensor local = at::full({2}, -1, at::kLong);
  if (mine != nullptr && complete(*mine, names)) {
    local[0] = mine->progress;
    local[1] = fingerprintOf(mine->members, mine->bounds);
  }
  at::Tensor all = at::empty({2 * world.size()}, at::kLong);
  world.allGather(local, all).wait();
  const auto* data = all.data_ptr<std::int64_t>();
  return {data, data + all.numel()};
}

// The holder of each old slice, or an explanation of why some slice has none.
bool findHolders(Reshard& plan, const std::vector<int>& old_members,
                 const std::vector<int>& members, const std::vector<std::int64_t>& progress,
                 std::int64_t expected_fingerprint, std::int64_t step, std::string& why) {
  const auto newRankOf = [&](int member) {
    const auto found = std::find(members.begin(), members.end(), member);
    return found == members.end() ? -1 : static_cast<int>(found - members.begin());
  };
  for (std::size_t rank = 0; rank < members.size(); ++rank) {
    if (std::find(old_members.begin(), old_members.end(), members[rank]) == old_members.end())
      continue;  // a joiner holds nothing
    if (progress[2 * rank + 1] != expected_fingerprint || progress[2 * rank] != step) {
      why = detail::concat("rank ", members[rank], "'s slices are not those of step ", step,
                           " in the world they were cut for");
      return false;
    }
  }
  const int slices = static_cast<int>(old_members.size());
  plan.holder.assign(slices, -1);
  for (int slice = 0; slice < slices; ++slice) {
    const int owner = newRankOf(old_members[slice]);
    const int predecessor = slices > 1 ? newRankOf(old_members[(slice + slices - 1) % slices]) : -1;
    plan.holder[slice] = owner >= 0 ? owner : predecessor;
    if (plan.holder[slice] < 0 && plan.oldSlice(slice).size() > 0) {
      why = detail::concat(
          "rank ", old_members[slice],
          " and its predecessor, which kept the replica of its slice, were both lost");
      return false;
    }
  }
  return true;
}

// Every new rank's ranges: its slice and, in a world of two or more, its successor's.
std::vector<std::vector<Range>> neededRanges(const std::vector<std::int64_t>& bounds) {
  const int ranks = static_cast<int>(bounds.size()) - 1;
  std::vector<std::vector<Range>> needed(ranks);
  for (int rank = 0; rank < ranks; ++rank) {
    needed[rank].push_back({bounds[rank], bounds[rank + 1]});
    const int successor = (rank + 1) % ranks;
    if (ranks > 1) needed[rank].push_back({bounds[successor], bounds[successor + 1]});
  }
  return needed;
}

// The part of old slice `slice` that `piece` covers, from this rank's holding of tensor `name`.
at::Tensor heldPiece(const ZeroHolding& mine, const Reshard& plan, int slice,
                     const std::string& name, Range piece) {
  const auto& held = slice == mine.rank ? mine.own : mine.replica;
  const auto found = held.find(name);
  if (found == held.end())
    CHORUS_THROW(CommError, "ZeRO replicas: rank ", mine.rank, " holds no '", name, "' of slice ",
                 slice);
  return found->second.narrow(0, piece.begin - plan.old_bounds[slice], piece.size());
}

// One tensor (`name`) cut anew: returns this rank's ranges of it (slice, replica), filled from
// the holders in one all-to-all.
std::vector<at::Tensor> reshardTensor(comm::Communicator& world, const Reshard& plan,
                                      const ZeroHolding* mine, const std::string& name) {
  const int ranks = world.size(), me = world.rank();
  const int slices = static_cast<int>(plan.holder.size());
  std::vector<at::Tensor> sent;
  std::vector<std::int64_t> send_counts(ranks, 0), recv_counts(ranks, 0);
  for (int to = 0; to < ranks; ++to)
    for (Range range : plan.needed[to])
      for (int slice = 0; slice < slices; ++slice) {
        const Range piece = intersect(range, plan.oldSlice(slice));
        if (plan.holder[slice] != me || piece.size() == 0) continue;
        sent.push_back(heldPiece(*mine, plan, slice, name, piece));
        send_counts[to] += piece.size();
      }
  for (int from = 0; from < ranks; ++from)
    for (Range range : plan.needed[me])
      for (int slice = 0; slice < slices; ++slice)
        if (plan.holder[slice] == from)
          recv_counts[from] += intersect(range, plan.oldSlice(slice)).size();
  at::Tensor input = sent.empty() ? at::empty({0}, at::kFloat) : at::cat(sent);
  std::int64_t received = 0;
  for (std::int64_t count : recv_counts) received += count;
  at::Tensor output = at::empty({received}, at::kFloat);
  world.allToAll(input, output, send_counts, recv_counts).wait();
  // Unpacked in the order it was packed: by sender, then range, then old slice.
  std::vector<at::Tensor> ranges;
  for (Range range : plan.needed[me]) ranges.push_back(at::empty({range.size()}, at::kFloat));
  std::int64_t offset = 0;
  for (int from = 0; from < ranks; ++from)
    for (std::size_t r = 0; r < plan.needed[me].size(); ++r)
      for (int slice = 0; slice < slices; ++slice) {
        const Range piece = intersect(plan.needed[me][r], plan.oldSlice(slice));
        if (plan.holder[slice] != from || piece.size() == 0) continue;
        ranges[r]
            .narrow(0, piece.begin - plan.needed[me][r].begin, piece.size())
            .copy_(output.narrow(0, offset, piece.size()));
        offset += piece.size();
      }
  return ranges;
}

}  // namespace

ZeroHolding holdingOf(const parallel::ZeroOptimizer& zero, const std::vector<int>& members,
                      std::int64_t progress) {
  ZeroHolding holding;
  holding.members = members;
  holding.bounds = zero.bounds();
  holding.rank = zero.rank();
  holding.progress = progress;
  holding.own = zero.sliceState();
  holding.own[kMaster] = zero.masterSlice().clone();
  if (zero.redundant()) {
    holding.replica = zero.replicaState();
    holding.replica[kMaster] = zero.replicaMasterSlice().clone();
  }
  return holding;
}

nlohmann::json replicaHeader(const ZeroHolding& source) {
  nlohmann::json names = nlohmann::json::array();
  for (const auto& [name, tensor] : source.own)
    if (name != kStep) names.push_back(name);
  nlohmann::json header = {{"members", source.members},
                           {"bounds", source.bounds},
                           {"names", names},
                           {"fingerprint", fingerprintOf(source.members, source.bounds)}};
  const auto step = source.own.find(kStep);
  if (step != source.own.end()) header[kStep] = step->second.item<double>();
  return header;
}

bool restoreFromReplicas(parallel::ZeroOptimizer& zero, comm::Communicator& world,
                         const nlohmann::json& header, const ZeroHolding* mine,
                         const std::vector<int>& members, std::int64_t step, std::string& why) {
  Reshard plan;
  plan.old_bounds = header.at("bounds").get<std::vector<std::int64_t>>();
  const auto old_members = header.at("members").get<std::vector<int>>();
  const std::vector<std::int64_t> progress = gatherProgress(world, mine, header.at("names"));
  if (!findHolders(plan, old_members, members, progress,
                   header.at("fingerprint").get<std::int64_t>(), step, why))
    return false;
  plan.needed = neededRanges(zero.bounds());
  std::map<std::string, at::Tensor> own, replica;
  for (const auto& name : header.at("names")) {
    const std::vector<at::Tensor> ranges =
        reshardTensor(world, plan, mine, name.get<std::string>());
    own[name] = ranges.at(0);
    if (ranges.size() > 1) replica[name] = ranges[1];
  }
  if (header.contains(kStep)) {
    own[kStep] = at::tensor({header.at(kStep).get<double>()}, at::kDouble);
    replica[kStep] = own[kStep];
  }
  zero.loadMasterSlice(own.at(kMaster));
  own.erase(kMaster);
  zero.loadSliceState(own);
  if (zero.redundant()) {
    zero.loadReplicaMasterSlice(replica.at(kMaster));
    replica.erase(kMaster);
    zero.loadReplicaState(replica);
  }
  return true;
}

}  // namespace chorus::runtime
