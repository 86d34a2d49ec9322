// Elastic recovery of the executor (docs/elastic.md): after a collective failed because a worker
// was lost, the survivors agree on the next generation, the survivor that got furthest hands its
// state to the others over the new world communicator, every survivor rebuilds its step engine
// for the survivors' plan (the lost ranks' samples spread over them), and the loop redoes the
// interrupted step: the parameters and the optimizer state change only after a step's reduction
// completed on every rank, and the sampler's batches depend on the step alone, so the run goes on
// along the trajectory of an uninterrupted one.
#include <ATen/ATen.h>

#include <algorithm>

#include "chorus/comm/store/prefix_store.h"
#include "chorus/core/clock.h"
#include "chorus/core/error.h"
#include "chorus/core/logging.h"
#include "train/data_parallel_engine.h"
#include "train/trainer_state.h"

namespace chorus::runtime {
namespace {

// `bytes` from group rank `root` to every rank (the length first, then the bytes).
std::string broadcastBytes(comm::Communicator& world, const std::string& bytes, int root) {
  at::Tensor length =
      at::tensor({static_cast<std::int64_t>(world.rank() == root ? bytes.size() : 0)}, at::kLong);
  world.broadcast(length, root).wait();
  at::Tensor data = at::empty({length.item<std::int64_t>()}, at::kByte);
  if (world.rank() == root) std::memcpy(data.data_ptr(), bytes.data(), bytes.size());
  world.broadcast(data, root).wait();
  return std::string(static_cast<const char*>(data.data_ptr()), data.numel());
}

// The ranks of the members of `next` in the engine's world (`engine_members`: the members the
// engine and the plan were built for, which a failed attempt leaves unchanged).
std::vector<int> keptRanks(const std::vector<int>& engine_members, const Generation& next) {
  std::vector<int> kept;
  for (int member : next.members) {
    const auto found = std::find(engine_members.begin(), engine_members.end(), member);
    if (found == engine_members.end())
      CHORUS_THROW(CommError, "elastic: rank ", member, " of generation ", next.number,
                   " is not one this worker trained with");
    kept.push_back(static_cast<int>(found - engine_members.begin()));
  }
  return kept;
}

// The plan of the survivors: their ranks' plans, one replica each with its new share. A replica
// that ran its share in one pass still does (its micro-batch grows with the share); a memory
// limit stays.
plan::Plan survivorPlan(const plan::Plan& plan, const std::vector<int>& kept,
                        const std::vector<std::int64_t>& shares) {
  std::map<int, const plan::ReplicaPlan*> replica_of_rank;
  for (const plan::ReplicaPlan& replica : plan.replicas)
    replica_of_rank[replica.stages.at(0).rank] = &replica;
  plan::Plan next = plan;
  next.ranks.clear();
  next.replicas.clear();
  for (std::size_t r = 0; r < kept.size(); ++r) {
    next.ranks.push_back(plan.ranks.at(kept[r]));
    plan::ReplicaPlan replica = *replica_of_rank.at(kept[r]);
    plan::StagePlan& stage = replica.stages.at(0);
    const bool one_pass = stage.micro_batch >= replica.share;
    replica.share = static_cast<int>(shares[r]);
    stage.rank = static_cast<int>(r);
    if (one_pass) stage.micro_batch = std::max(1, replica.share);
    next.replicas.push_back(replica);
  }
  return next;
}

std::string membersText(const std::vector<int>& members) {
  return members.empty() ? "none" : joinInts(members);
}

// One attempt: agree, regroup, hand over, rebuild. Throws CommError when another member is lost
// meanwhile.
RecoveryRecord recoverOnce(Trainer::State& s, const std::exception& failure,
                           const TrainerHooks& hooks) {
  TrainingContext& c = *s.context;
  ElasticMembership& membership = *s.membership;
  Stopwatch clock;
  const Generation next = membership.agree(s.next_step, failure);
  const double agree_seconds = clock.seconds();
  if (hooks.at_point) hooks.at_point(s.next_step, "recovery");
  const std::vector<int> kept = keptRanks(s.engine_members, next);
  std::string handover;
  if (next.source == c.worker->member()) handover = s.engine->handover(kept);
  const LocalCarry carry = s.engine->localCarry();
  membership.regroup(next);
  handover = broadcastBytes(*c.worker->world(), handover, next.rankOf(next.source));
  s.plan = survivorPlan(s.plan, kept, handoverShares(handover));
  s.engine.reset();  // its reducer's hooks go before the new one's are set
  s.engine = makeDataParallelEngine(c, s.plan);
  s.engine->adopt(handover, carry);
  s.engine_members = next.members;
  s.next_step = next.step;
  resetCheckpointWriter(s, next.number);
  RecoveryRecord record;
  record.generation = next.number;
  record.members = next.members;
  record.lost = next.lost;
  record.reason = next.reason;
  record.step = next.step;
  record.source = next.source;
  record.shares = s.engine->shares();
  record.agree_seconds = agree_seconds;
  record.rebuild_seconds = clock.seconds() - agree_seconds;
  return record;
}

}  // namespace

void recoverFromLoss(Trainer::State& s, std::exception_ptr failure, const TrainerHooks& hooks) {
  TrainingContext& c = *s.context;
  // A background checkpoint of the old generation may wait for a lost rank until its deadline;
  // it is left to finish (or fail) on its own, and the next one is written by the new generation.
  if (s.pending_checkpoint.valid())
    s.abandoned_checkpoints.push_back(std::move(s.pending_checkpoint));
  RecoveryRecord record;
  std::vector<int> lost;  // over every attempt
  for (;;) {
    try {
      std::rethrow_exception(failure);
    } catch (const CommError& error) {
      const int before = s.membership->current().number;
      try {
        record = recoverOnce(s, error, hooks);
        lost.insert(lost.end(), record.lost.begin(), record.lost.end());
        break;
      } catch (const CommError&) {
        if (s.membership->leftOut()) throw;
        failure = std::current_exception();  // another loss while recovering: agree again
        const Generation reached = s.membership->current();
        if (reached.number > before)
          lost.insert(lost.end(), reached.lost.begin(), reached.lost.end());
      }
    }
  }
  std::sort(lost.begin(), lost.end());
  lost.erase(std::unique(lost.begin(), lost.end()), lost.end());
  record.lost = lost;
  std::vector<int> shares(record.shares.begin(), record.shares.end());
  if (c.worker->rank() == 0)
    logWarn("elastic: generation ", record.generation, ": lost rank ", membersText(record.lost),
            " (", record.reason, "); ranks ", membersText(record.members), " go on from step ",
            record.step, " with shares ", joinInts(shares), "; agreed in ", record.agree_seconds,
            " s, rebuilt in ", record.rebuild_seconds, " s");
  if (hooks.on_recovery) hooks.on_recovery(record);
  if (static_cast<std::int64_t>(record.members.size()) >= c.job.elastic.min_devices) return;
  writeCheckpointIfDue(s, /*final_or_requested=*/true);
  finishPendingCheckpoint(s);
  CHORUS_THROW(
      CommError, "elastic: ", record.members.size(),
      " devices left, fewer than elastic.min_devices = ", c.job.elastic.min_devices,
      s.last_checkpoint_path.empty() ? "" : "; checkpoint written: ", s.last_checkpoint_path);
}

void resetCheckpointWriter(Trainer::State& s, int generation) {
  if (!s.checkpoints) return;
  TrainingContext& c = *s.context;
  auto store = std::make_shared<comm::PrefixStore>(
      "elastic/gen/" + std::to_string(generation) + "/checkpoint", c.worker->store());
  s.checkpoints = std::make_shared<CheckpointWriter>(s.checkpoints->options(), store,
                                                     c.worker->rank(), c.worker->worldSize());
}

}  // namespace chorus::runtime
