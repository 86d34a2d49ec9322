// Elastic recovery of the executor (docs/elastic.md): after a collective failed because a worker
// was lost (or was aborted because a worker joins), the members agree on the next generation, the
// one that got furthest hands its state to the others over the new world communicator, every
// member rebuilds its step engine for the next plan (the lost ranks' samples spread over the
// survivors, a joiner's share planned as its device was at launch), and the loop redoes the
// interrupted step: the parameters and the optimizer state change only after a step's reduction
// completed on every rank, and the sampler's batches depend on the step alone, so the run goes on
// along the trajectory of an uninterrupted one. With ZeRO, a lost rank's slice comes back from its
// replica on its predecessor (zero.redundancy = 1, zero_replicas.h); without one, or when a
// slice's holders are all lost, the members restore the last complete checkpoint, resharded
// over the new generation, and redo the steps since. A pipeline job's members re-cut the model
// over themselves (pipeline_regroup.h) and take their layers from the members that hold them —
// or, when a lost stage has no copy left, from the last checkpoint. A joiner starts here too
// (joinRunningJob).
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "chorus/comm/store/prefix_store.h"
#include "chorus/core/clock.h"
#include "chorus/core/error.h"
#include "chorus/core/logging.h"
#include "chorus/parallel/storage_bytes.h"
#include "chorus/plan/plan_json.h"
#include "chorus/plan/survivors.h"
#include "chorus/runtime/job/memory_calibration.h"
#include "job/job_sections.h"
#include "train/data_parallel_engine.h"
#include "train/joined_device.h"
#include "train/pipeline_regroup.h"
#include "train/trainer_state.h"

namespace chorus::runtime {
namespace {

// `bytes` from group rank `root` to every rank (the length first, then the bytes).
std::string broadcastBytes(comm::Communicator& world, const std::string& bytes, int root) {
  at::Tensor length =
      at::tensor({static_cast<std::int64_t>(world.rank() == root ? bytes.size() : 0)}, at::kLong);
  world.broadcast(length, root).wait();
  at::Tensor data = at::empty({length.item<std::int64_t>()}, at::kByte);
  if (data.numel() == 0) return "";  // an empty tensor has no buffer to copy to or from
  if (world.rank() == root) std::memcpy(data.data_ptr(), bytes.data(), bytes.size());
  world.broadcast(data, root).wait();
  return std::string(static_cast<const char*>(data.data_ptr()), data.numel());
}

// How the engine's world becomes `next`: the ranks of the members kept (in the world the engine
// was built for, `engine_members`, which a failed attempt leaves unchanged), then the launch rank
// each joiner runs in place of. Joiners' member ids are newer than every member's, so they come
// last in `next` too.
struct Change {
  std::vector<int> kept;
  std::vector<int> joiner_slots;  // kNewDevice for a device the launch plan does not have
  std::vector<int> joiners;       // their member ids
};

Change changeOf(const std::vector<int>& engine_members, const Generation& next) {
  Change change;
  for (int member : next.members) {
    const auto found = std::find(engine_members.begin(), engine_members.end(), member);
    if (found != engine_members.end() && change.joiner_slots.empty()) {
      change.kept.push_back(static_cast<int>(found - engine_members.begin()));
    } else if (next.joined.count(member) > 0) {
      change.joiner_slots.push_back(next.joined.at(member));
      change.joiners.push_back(member);
    } else {
      CHORUS_THROW(CommError, "elastic: rank ", member, " of generation ", next.number,
                   " neither trained with this worker nor joined");
    }
  }
  return change;
}

// The share `launch` planned for each launch rank of `slots`.
std::vector<std::int64_t> plannedShares(const plan::Plan& launch, const std::vector<int>& slots) {
  std::map<int, std::int64_t> share_of_rank;
  for (const plan::ReplicaPlan& replica : launch.replicas)
    share_of_rank[replica.stages.at(0).rank] = replica.share;
  std::vector<std::int64_t> shares;
  for (int slot : slots) shares.push_back(share_of_rank.at(slot));
  return shares;
}

// What the source works out for `next`: its members' shares, and the header every member needs
// before it can build its engine — the next plan (the joiners' entries taken from the launch plan),
// the launch rank each member runs in place of, and the launch plan with the new devices that
// joined appended.
struct Regroup {
  std::vector<std::int64_t> shares;
  std::string header;
};

// zero.shards = "memory": the next generation's shards are sized by its devices' memory (a new
// device's too), as at launch, rather than kept in proportion — where every device has a budget
// and a split fits them; else (and in a job that sets precision.ranks, which names launch ranks)
// the proportions stay.
void resizeShardsByMemory(const JobConfig& job, plan::Plan& next) {
  if (next.zero_stage == 0 || job.zero.shards != "memory" || !job.precision.ranks.empty()) return;
  std::vector<DeviceSpec> devices;
  for (const plan::RankPlan& rank : next.ranks) {
    devices.push_back(plan::jobDevice(rank));
    if (!devices.back().memory_budget) return;
  }
  try {
    // Sized by the plan's memory profile, not a new measurement in the middle of a recovery.
    next.zero_shards =
        zeroShardFractions(job, devices, {}, planMemoryModelForBudgets(job, next, devices));
  } catch (const ConfigError& error) {
    logWarn("elastic: ZeRO shards keep their proportions: ", error.message());
  }
}

// The shares of s.engine_members: the engine's, or, where a failed attempt left none, those its
// plan gave them.
std::vector<std::int64_t> currentShares(const Trainer::State& s) {
  if (s.engine) return s.engine->shares();
  std::vector<std::int64_t> shares;
  for (const plan::ReplicaPlan& replica : s.plan.replicas) shares.push_back(replica.share);
  return shares;
}

Regroup regroupOf(const Trainer::State& s, const Generation& next, Change change) {
  // A new device gets a slot of its own, at the end of the launch plan; a failed attempt leaves
  // every member's launch plan as it was (they take this one from the header).
  plan::Plan launch = s.launch_plan;
  std::map<int, int> slot_of_joiner;
  for (std::size_t j = 0; j < change.joiners.size(); ++j) {
    int& slot = change.joiner_slots[j];
    if (slot == kNewDevice)
      slot = plan::addJoinedDevice(launch,
                                   joinedDeviceOf(*s.context->worker->store(), change.joiners[j]),
                                   s.context->job.train.micro_batch);
    slot_of_joiner[change.joiners[j]] = slot;
  }
  std::vector<int> kept_slots;
  for (int rank : change.kept) kept_slots.push_back(slotOf(s, s.engine_members.at(rank)));
  const std::vector<std::int64_t> shares =
      plan::regroupShares(currentShares(s), change.kept, plannedShares(launch, kept_slots),
                          plannedShares(launch, change.joiner_slots));
  plan::Plan next_plan =
      plan::regroupPlan(s.plan, change.kept, launch, change.joiner_slots, shares, kept_slots);
  resizeShardsByMemory(s.context->job, next_plan);
  nlohmann::json slots = nlohmann::json::array();
  for (int member : next.members) {
    const auto joined = slot_of_joiner.find(member);
    slots.push_back({member, joined != slot_of_joiner.end() ? joined->second : slotOf(s, member)});
  }
  return {shares,
          nlohmann::json{
              {"plan", plan::toJson(next_plan)}, {"slots", slots}, {"launch", plan::toJson(launch)}}
              .dump()};
}

// The engine that runs `plan`'s shape.
std::unique_ptr<StepEngine> engineFor(TrainingContext& c, const plan::Plan& plan) {
  return plan.stageCount() > 1 ? makePipelineStageEngine(c, plan) : makeDataParallelEngine(c, plan);
}

// ZeRO with replicas: this generation's slices cut from what the members held (collective).
// False when some slice has no holder at the step the members go on from.
bool restoreReplicas(Trainer::State& s, const nlohmann::json& header, const Generation& next) {
  TrainingContext& c = *s.context;
  auto& engine = dynamic_cast<DataParallelEngine&>(*s.engine);
  std::string why;
  const ZeroHolding* mine = s.zero_holding ? &*s.zero_holding : nullptr;
  parallel::ZeroOptimizer& zero = *engine.zero();
  if (restoreFromReplicas(zero, *c.worker->world(), header.at("zero_replicas"), mine, next.members,
                          next.step, why)) {
    // The slices are this generation's now: should the parameters' all-gather fail on this rank
    // and complete on another, both hold slices of this world in the next attempt.
    s.zero_holding = holdingOf(zero, next.members, next.step);
    zero.gatherParameters();
    if (c.worker->rank() == 0)
      logInfo("elastic: ZeRO slices rebuilt from the members' replicas at step ", next.step);
    return true;
  }
  if (c.worker->rank() == 0)
    logWarn("elastic: ZeRO slices cannot come back from replicas (", why,
            "); going back to the last checkpoint");
  return false;
}

// Every member's side of the regrouping once `next` formed: the source's header and handover
// reach every member, and each builds its engine for the next plan. `carry` is this rank's own
// state to keep (none for a joiner); `hooks` are the run's (fault injection).
void adoptGeneration(Trainer::State& s, const Generation& next, std::string header,
                     std::string handover, const LocalCarry& carry, const TrainerHooks& hooks) {
  TrainingContext& c = *s.context;
  comm::Communicator& world = *c.worker->world();
  const int root = next.rankOf(next.source);
  header = broadcastBytes(world, header, root);
  handover = broadcastBytes(world, handover, root);
  const nlohmann::json parsed = nlohmann::json::parse(header);
  // The source could not plan the next generation: every member stops with its reason.
  if (parsed.contains("error"))
    CHORUS_THROW(ConfigError, "elastic: ", parsed.at("error").get<std::string>());
  s.plan = plan::parsePlanJson(parsed.at("plan").dump(), "the elastic handover");
  s.launch_plan = plan::parsePlanJson(parsed.at("launch").dump(), "the elastic handover");
  s.slots.clear();
  for (const auto& pair : parsed.at("slots"))
    s.slots[pair.at(0).get<int>()] = pair.at(1).get<int>();
  // A pipeline's layers come from the members that hold them, while their engines still do.
  std::optional<ReceivedStates> layers;
  if (s.launch_plan.stageCount() > 1) layers = layersFromMembers(s, s.plan, next.step, hooks);
  // Until this generation's engine holds its layers (from the members or the checkpoint), the
  // model's values are of no known step: a failed attempt must not offer them.
  s.layers_unsure = true;
  s.engine.reset();  // its reducer's hooks go before the new one's are set
  // The plan is this generation's now, engine or not: a build that fails leaves a rank that the
  // next attempt regroups from these members (and, as its source, from the checkpoint).
  s.engine_members = next.members;
  // ZeRO-3 leaves the parameters without bytes between steps, and the next engine is built over
  // them (their values come from the checkpoint).
  parallel::allocateDroppedStorages(c.model->parameters());
  if (hooks.at_point) hooks.at_point(next.step, "rebuild");
  s.engine = engineFor(c, s.plan);
  s.next_step = next.step;
  if (layers) {
    installLayerStates(*s.engine, std::move(*layers));
    s.layers_unsure = false;
    resetCheckpointWriter(s, next.number);
    return;
  }
  // ZeRO with replicas adopts the shares, the balancer and its own loss scale before the
  // collectives of the reshard: an attempt that fails there leaves an engine that carries them
  // into the next one (the checkpoint, when it comes to that, sets them again).
  const bool replicas = parsed.contains("checkpoint") && parsed.contains("zero_replicas");
  if (!parsed.contains("checkpoint") || replicas) s.engine->adopt(handover, carry);
  // ZeRO without replicas, or with a slice no member holds: the lost slices come back from the
  // last checkpoint, resharded over this generation, and the run goes on from its step.
  if (parsed.contains("checkpoint") && !(replicas && restoreReplicas(s, parsed, next)))
    restoreCheckpoint(s, parsed.at("checkpoint").get<std::string>());
  s.layers_unsure = false;
  resetCheckpointWriter(s, next.number);
}

// The checkpoint a ZeRO job's next generation restores: the last complete one (every job with
// elastic recovery and ZeRO writes one before its first step).
std::string withLastCheckpoint(const Trainer::State& s, const std::string& header) {
  nlohmann::json parsed = nlohmann::json::parse(header);
  parsed["checkpoint"] = resolveCheckpoint("latest", s.context->job.checkpoint.dir);
  return parsed.dump();
}

// The header of a source whose engine a failed attempt took (another loss while it was being
// built): the state it trained is gone, so the members go back to the last checkpoint, or, with
// none, every member stops with the reason.
std::string withoutState(const Trainer::State& s, const Generation& next,
                         const std::string& header) {
  const std::string why = "rank " + std::to_string(next.source) + ", the source of generation " +
                          std::to_string(next.number) +
                          ", lost its training state when a loss interrupted its engine's rebuild";
  logWarn("elastic: ", why);
  if (s.context->job.checkpoint.dir.empty())
    return nlohmann::json{{"error", why + ", and the job writes no checkpoint to go back to"}}
        .dump();
  try {
    return withLastCheckpoint(s, header);
  } catch (const CheckpointError& error) {
    return nlohmann::json{{"error", why + ", and no checkpoint can be read: " + error.message()}}
        .dump();
  }
}

// The header of a ZeRO job whose slices have replicas: what the members need to rebuild the
// slices from them (zero_replicas.h).
std::string withReplicas(const std::string& header, const ZeroHolding& holding) {
  nlohmann::json parsed = nlohmann::json::parse(header);
  parsed["zero_replicas"] = replicaHeader(holding);
  return parsed.dump();
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
  const Change change = changeOf(s.engine_members, next);
  std::string header, handover;
  if (next.source == c.worker->member() && s.launch_plan.stageCount() > 1) {
    header = withLastCheckpoint(s, pipelineHeader(s, next));
  } else if (next.source == c.worker->member() && !s.engine) {
    header = withoutState(s, next, regroupOf(s, next, change).header);
  } else if (next.source == c.worker->member()) {
    const Regroup regroup = regroupOf(s, next, change);
    if (s.plan.zero_stage > 0) {
      header = withLastCheckpoint(s, regroup.header);
      if (s.zero_holding) {
        header = withReplicas(header, *s.zero_holding);
        handover = s.engine->handover(change.kept, regroup.shares);
      }
    } else {
      header = regroup.header;
      handover = s.engine->handover(change.kept, regroup.shares);
    }
  }
  // A failed attempt may have left no engine (its rebuild was collective).
  const LocalCarry carry = s.engine ? s.engine->localCarry() : LocalCarry{};
  membership.regroup(next);
  adoptGeneration(s, next, std::move(header), std::move(handover), carry, hooks);
  RecoveryRecord record;
  record.generation = next.number;
  record.members = next.members;
  record.lost = next.lost;
  for (const auto& joined : next.joined) record.joined.push_back(joined.first);
  record.reason = next.reason;
  record.step = s.next_step;  // next.step, or the checkpoint's for ZeRO
  record.source = next.source;
  record.shares = s.engine->shares();
  record.agree_seconds = agree_seconds;
  record.rebuild_seconds = clock.seconds() - agree_seconds;
  return record;
}

// " and ZeRO shards 0.250/0.417/0.333" where the plan sizes them; else "".
std::string zeroShardsText(const plan::Plan& plan) {
  if (plan.zero_stage == 0 || plan.zero_shards.empty()) return "";
  std::string text = " and ZeRO shards ";
  char number[32];
  for (std::size_t r = 0; r < plan.zero_shards.size(); ++r) {
    std::snprintf(number, sizeof number, "%s%.3f", r ? "/" : "", plan.zero_shards[r]);
    text += number;
  }
  return text;
}

}  // namespace

int slotOf(const Trainer::State& s, int member) {
  const auto found = s.slots.find(member);
  return found == s.slots.end() ? member : found->second;
}

bool recoversFromCheckpoints(const Trainer::State& s) {
  return s.plan.zero_stage > 0 || s.launch_plan.stageCount() > 1;
}

void recoverFromLoss(Trainer::State& s, std::exception_ptr failure, const TrainerHooks& hooks) {
  TrainingContext& c = *s.context;
  // A background checkpoint of the old generation gives up once its world is aborted (a lost rank
  // can never hand in its files); it ends on its own thread, and the new generation writes the
  // next one. Those that ended are dropped.
  if (s.pending_checkpoint.valid())
    s.abandoned_checkpoints.push_back(std::move(s.pending_checkpoint));
  std::erase_if(s.abandoned_checkpoints, [](const std::future<std::string>& write) {
    return write.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  });
  // What this rank holds of ZeRO's slices, kept over every attempt: a failed one may have
  // rebuilt the engine already.
  if (auto* engine = dynamic_cast<DataParallelEngine*>(s.engine.get());
      !s.zero_holding && engine != nullptr && engine->zero() && s.context->job.zero.redundancy > 0)
    s.zero_holding = holdingOf(*engine->zero(), s.engine_members, s.next_step);
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
  s.zero_holding.reset();
  std::sort(lost.begin(), lost.end());
  lost.erase(std::unique(lost.begin(), lost.end()), lost.end());
  record.lost = lost;
  std::vector<int> shares(record.shares.begin(), record.shares.end());
  if (c.worker->rank() == 0)
    logWarn("elastic: generation ", record.generation, ":",
            record.lost.empty() ? "" : " lost rank " + joinInts(record.lost),
            record.joined.empty() ? "" : " joined rank " + joinInts(record.joined), " (",
            record.reason, "); ranks ", joinInts(record.members), " go on from step ", record.step,
            " with shares ", joinInts(shares), zeroShardsText(s.plan), "; agreed in ",
            record.agree_seconds, " s, rebuilt in ", record.rebuild_seconds, " s");
  if (hooks.on_recovery) hooks.on_recovery(record);
  if (static_cast<std::int64_t>(record.members.size()) >= c.job.elastic.min_devices) return;
  writeCheckpointIfDue(s, /*final_or_requested=*/true);
  finishPendingCheckpoint(s);
  CHORUS_THROW(
      CommError, "elastic: ", record.members.size(),
      " devices left, fewer than elastic.min_devices = ", c.job.elastic.min_devices,
      s.last_checkpoint_path.empty() ? "" : "; checkpoint written: ", s.last_checkpoint_path);
}

void joinRunningJob(Trainer::State& s, const ElasticOptions& options) {
  TrainingContext& c = *s.context;
  const bool new_device = c.worker->identity().new_device;
  const int replaces = new_device ? kNewDevice : c.worker->identity().replaces;
  logInfo("elastic: rank ", c.worker->member(), " asks to join the job ",
          new_device ? "with a new device, " + c.worker->identity().device.toString()
                     : "in place of rank " + std::to_string(replaces));
  Stopwatch clock;
  if (new_device) postJoinedDevice(c.job, *c.worker);
  s.membership = ElasticMembership::join(c.worker, options, replaces);
  const Generation next = s.membership->current();
  s.membership->regroup(next);
  adoptGeneration(s, next, "", "", LocalCarry{}, TrainerHooks{});
  std::vector<int> shares;
  for (std::int64_t share : s.engine->shares()) shares.push_back(static_cast<int>(share));
  logInfo("elastic: rank ", c.worker->member(), " joined generation ", next.number, " as rank ",
          c.worker->rank(), " of ", c.worker->worldSize(), " at step ", next.step, " (shares ",
          joinInts(shares), ") after ", clock.seconds(), " s");
}

void resetCheckpointWriter(Trainer::State& s, int generation) {
  if (!s.checkpoints) return;
  TrainingContext& c = *s.context;
  auto store = std::make_shared<comm::PrefixStore>(
      "elastic/gen/" + std::to_string(generation) + "/checkpoint", c.worker->store());
  CheckpointOptions options = s.checkpoints->options();
  // A write of this generation that a lost rank can never complete ends with the generation
  // (its world is aborted as soon as the loss is known), not at the checkpoint deadline.
  options.cancelled = [world = c.worker->world()] { return world->broken(); };
  s.checkpoints =
      std::make_shared<CheckpointWriter>(options, store, c.worker->rank(), c.worker->worldSize());
}

}  // namespace chorus::runtime
