#include "chorus/plan/plan.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "chorus/core/error.h"

namespace chorus::plan {

const char* toString(Schedule schedule) { return schedule == Schedule::kGpipe ? "gpipe" : "1f1b"; }

namespace {

void checkComm(const CommPlan& comm) {
  const CodecOptions& codec = comm.codec;
  CHORUS_CHECK_CONFIG(comm.sync_period >= 1, "plan: comm.sync_period must be >= 1");
  CHORUS_CHECK_CONFIG(comm.bucket_mb > 0 && comm.first_bucket_mb > 0,
                      "plan: comm.bucket_mb and first_bucket_mb must be positive");
  CHORUS_CHECK_CONFIG(comm.min_buckets >= 1 && comm.min_buckets <= 1024,
                      "plan: comm.min_buckets must be in [1, 1024]");
  CHORUS_CHECK_CONFIG(codec.int8_chunk >= 1, "plan: comm.int8_chunk must be >= 1");
  CHORUS_CHECK_CONFIG(codec.topk_ratio > 0 && codec.topk_ratio <= 1,
                      "plan: comm.topk_ratio must be in (0, 1]");
  CHORUS_CHECK_CONFIG(codec.powersgd_rank >= 1 && codec.powersgd_iterations >= 1 &&
                          codec.powersgd_min_compression_rate >= 1 &&
                          codec.powersgd_start_step >= 0 && codec.powersgd_min_elements >= 0,
                      "plan: comm.powersgd_rank, powersgd_iterations and "
                      "powersgd_min_compression_rate must be >= 1, powersgd_start_step and "
                      "powersgd_min_elements >= 0");
}

}  // namespace

bool priced(AllReduceAlgorithm algorithm) {
  return algorithm == AllReduceAlgorithm::kFlat || algorithm == AllReduceAlgorithm::kHierarchical;
}

bool priced(CodecKind codec) {
  return codec == CodecKind::kNone || codec == CodecKind::kFp16 || codec == CodecKind::kBf16 ||
         codec == CodecKind::kInt8;
}

// Core's names, but "ring" for kFlat: plan files always said so.
const char* planName(AllReduceAlgorithm algorithm) {
  return algorithm == AllReduceAlgorithm::kFlat ? "ring" : toString(algorithm);
}

const DeviceSpec& jobDevice(const RankPlan& rank) {
  CHORUS_CHECK_CONFIG(rank.spec.has_value(), "plan: the rank on device ", rank.device, " ('",
                      rank.device_type, "') names no job device; adopt the plan for a job first");
  return *rank.spec;
}

Schedule parseSchedule(const std::string& text) {
  if (text == "gpipe") return Schedule::kGpipe;
  if (text == "1f1b") return Schedule::kOneFOneB;
  CHORUS_THROW(ConfigError, "unknown schedule '", text, "'; known: gpipe, 1f1b");
}

AllReduceAlgorithm parsePlanAllReduceAlgorithm(const std::string& text) {
  if (text == "ring") return AllReduceAlgorithm::kFlat;
  CHORUS_CHECK_CONFIG(text != "flat", "all-reduce algorithm 'flat' is spelled 'ring' in a plan");
  return parseAllReduceAlgorithm(text);
}

void Plan::validate(int layer_count) const {
  CHORUS_CHECK_CONFIG(global_batch >= 1, "plan: global_batch must be >= 1");
  CHORUS_CHECK_CONFIG(micro_batches >= 1, "plan: micro_batches must be >= 1");
  CHORUS_CHECK_CONFIG(zero_stage >= 0 && zero_stage <= 3, "plan: zero_stage must be 0..3");
  validateZeroShards();
  checkComm(comm);
  CHORUS_CHECK_CONFIG(!replicas.empty(), "plan: no replicas");
  const int stages = stageCount();
  CHORUS_CHECK_CONFIG(stages >= 1, "plan: replica 0 has no stages");
  std::vector<int> uses(ranks.size(), 0);
  long long total = 0;
  for (size_t r = 0; r < replicas.size(); ++r) {
    const ReplicaPlan& replica = replicas[r];
    CHORUS_CHECK_CONFIG(replica.share >= 1, "plan: replica ", r, " has share ", replica.share,
                        "; every replica needs at least one sample");
    total += replica.share;
    CHORUS_CHECK_CONFIG(static_cast<int>(replica.stages.size()) == stages, "plan: replica ", r,
                        " has ", replica.stages.size(), " stages, replica 0 has ", stages);
    for (int s = 0; s < stages; ++s) {
      const StagePlan& stage = replica.stages[s];
      const StagePlan& reference = replicas[0].stages[s];
      const int expected_first = s == 0 ? 0 : replica.stages[s - 1].last_layer;
      CHORUS_CHECK_CONFIG(
          stage.first_layer == expected_first && stage.last_layer > stage.first_layer,
          "plan: replica ", r, " stage ", s, " covers layers [", stage.first_layer, ", ",
          stage.last_layer, "); expected a non-empty range from ", expected_first);
      CHORUS_CHECK_CONFIG(
          stage.first_layer == reference.first_layer && stage.last_layer == reference.last_layer,
          "plan: replica ", r, " stage ", s,
          " is cut differently from replica 0; replicas must share their cuts");
      CHORUS_CHECK_CONFIG(stage.rank >= 0 && stage.rank < static_cast<int>(ranks.size()),
                          "plan: replica ", r, " stage ", s, " names rank ", stage.rank, " of ",
                          ranks.size());
      ++uses[stage.rank];
      CHORUS_CHECK_CONFIG(stage.micro_batch >= 1 && stage.micro_batch <= replica.share,
                          "plan: replica ", r, " stage ", s, " micro_batch ", stage.micro_batch,
                          " must be in [1, share ", replica.share, "]");
      const int largest = (replica.share + micro_batches - 1) / micro_batches;
      if (stages > 1)
        CHORUS_CHECK_CONFIG(micro_batches <= replica.share && stage.micro_batch == largest,
                            "plan: replica ", r, " stage ", s, ": share ", replica.share, " in ",
                            micro_batches, " micro-batches needs micro_batch ", largest, ", not ",
                            stage.micro_batch);
    }
    CHORUS_CHECK_CONFIG(replica.stages.back().last_layer == layer_count, "plan: replica ", r,
                        " ends at layer ", replica.stages.back().last_layer, ", the model has ",
                        layer_count);
  }
  CHORUS_CHECK_CONFIG(total == global_batch, "plan: shares sum to ", total, ", global_batch is ",
                      global_batch);
  for (size_t rank = 0; rank < uses.size(); ++rank)
    CHORUS_CHECK_CONFIG(uses[rank] == 1, "plan: rank ", rank, " runs ", uses[rank],
                        " stages; every rank runs exactly one");
}

void Plan::validateZeroShards() const {
  if (zero_shards.empty()) return;
  CHORUS_CHECK_CONFIG(zero_stage >= 1, "plan: zero_shards without a ZeRO stage");
  CHORUS_CHECK_CONFIG(zero_shards.size() == ranks.size(), "plan: ", zero_shards.size(),
                      " zero_shards for ", ranks.size(), " ranks");
  double total = 0;
  for (size_t r = 0; r < zero_shards.size(); ++r) {
    CHORUS_CHECK_CONFIG(zero_shards[r] >= 0 && zero_shards[r] <= 1, "plan: rank ", r,
                        "'s zero shard ", zero_shards[r], " is not a fraction in [0, 1]");
    total += zero_shards[r];
  }
  CHORUS_CHECK_CONFIG(std::abs(total - 1) <= 1e-6, "plan: the zero_shards sum to ", total,
                      ", not 1");
}

std::string Plan::summary() const {
  std::ostringstream out;
  const int stages = stageCount();
  if (stages <= 1) {
    int low = global_batch, high = 0;
    for (const auto& replica : replicas) {
      low = std::min(low, replica.share);
      high = std::max(high, replica.share);
    }
    out << "DP x" << replicas.size() << ", shares ";
    if (low == high)
      out << low;
    else
      out << high << ".." << low;
  } else {
    out << replicas.size() << (replicas.size() == 1 ? " replica" : " replicas") << " x " << stages
        << " stages, cuts ";
    for (const auto& stage : replicas[0].stages) out << stage.first_layer << "|";
    out << replicas[0].stages.back().last_layer << ", M=" << micro_batches << " "
        << toString(schedule);
  }
  out << ", ZeRO-" << zero_stage;
  int checkpointed = 0;
  for (const auto& stage : replicas[0].stages) checkpointed += stage.checkpoint;
  if (checkpointed) out << ", ckpt";
  if (comm.codec.kind != CodecKind::kNone)
    out << ", " << toString(comm.codec.kind) << " inter-node";
  return out.str();
}

}  // namespace chorus::plan
