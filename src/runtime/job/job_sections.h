// Private to runtime: readers of the job config's newer sections (precision, checkpoint,
// parallel), and the checks of [parallel] against the rest of the job.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "chorus/core/config.h"
#include "chorus/plan/memory_model.h"
#include "chorus/plan/plan.h"
#include "chorus/runtime/job/job_config.h"

namespace chorus::runtime {

// Throws ConfigError "config key '<key>': <what>" unless `ok`.
void require(bool ok, const std::string& key, const std::string& what);
// Throws ConfigError "config key '<key>': '<value>' is unknown; expected a, b" unless `value` is
// one of `choices`.
void requireChoice(const std::string& value, const std::string& key,
                   std::initializer_list<const char*> choices);

// [comm] on its own (comm_section.cc): names, ranges, the combinations that cannot run, and the
// codec knobs the job's codec does not read. Throws ConfigError naming the key.
void checkComm(const CommSection& comm);
// The [comm] keys a plan decides (all but timeout_s and cpu_transport), without "comm.".
const std::vector<std::string>& commKeysThePlanDecides();
// The job's [comm] in the plan's terms, the codec seeded with the job's seed.
plan::CommPlan commOf(const JobConfig& job);
// `comm` as `planned` runs it: every key the plan decides takes the plan's value, checked again
// (checkComm). Throws ConfigError naming the key where the job wrote another value
// (CommSection::given), or where the plan sets a codec knob that the job has no key for.
CommSection commUnderPlan(CommSection comm, const plan::CommPlan& planned);

PrecisionSection readPrecision(const Config& config);
CheckpointSection readCheckpoint(const Config& config);
// [zero] on its own (zero_section.cc).
ZeroSection readZero(const Config& config);
// [zero] against the rest of the job: what a sharded step does not combine with (yet), and a
// shard list of the wrong length when the devices are listed. Throws ConfigError naming the key.
void checkZero(const JobConfig& job);
// Each rank's fraction of ZeRO's sharded state for `job` on `devices` (rank order): the job's
// list; empty (even) for "even", and for "memory" when no device has a budget; else by memory
// (plan::zeroShardsByMemory over 90% of each budget, after the replicated state and one sample's
// activations; the rest of a budget goes to micro-batches); for "speed", in proportion to the
// devices' expected speeds (startSpeeds in job_plan.h over `rates`, empty: emulated speeds
// alone), so that a slow device steps a small slice of the optimizer instead of all of it. Empty
// without a ZeRO stage. `memory`: the memory model to size by (a running plan's,
// planMemoryModel); null: the job's, measured now. Throws ConfigError when only some devices have
// budgets, or they cannot hold the state.
std::vector<double> zeroShardFractions(const JobConfig& job, const std::vector<DeviceSpec>& devices,
                                       const std::vector<double>& rates = {},
                                       std::shared_ptr<const plan::MemoryModel> memory = nullptr);
// The fraction of the sharded state rank `rank` of `ranks` holds as a replica of its successor's
// slice under `zero`'s redundancy (`shards`: the plan's fractions, empty when even); 0 without.
double replicaFraction(const ZeroSection& zero, const std::vector<double>& shards, int rank,
                       int ranks);
// [elastic] on its own, and against the rest of the job: what elastic recovery cannot recover
// yet is refused (elastic_section.cc). Throw ConfigError naming the key.
ElasticSection readElastic(const Config& config);
void checkElastic(const JobConfig& job);
// Each [parallel] key on its own (names, ranges, the partition's syntax).
ParallelSection readParallel(const Config& config);
// [parallel] against the other sections: the device count (unless "auto"), the global batch,
// the features a pipeline does not combine with, and the pipeline keys that plain data
// parallelism would ignore (when `config` sets them). Throws ConfigError naming the key.
void checkParallel(const JobConfig& job, const Config& config);
// The [comm] of a pipeline of `replicas` replicas: what its stage all-reduces do not combine with.
void checkPipelineComm(const CommSection& comm, std::int64_t replicas);
// Keys a pipeline would accept and not read (balancer.leave_out; the gradient buckets of a single
// pipeline), checked after every other check so that a combination that cannot run is named
// first. Throws ConfigError naming the key.
void rejectKeysAPipelineIgnores(const JobConfig& job, const Config& config);
// plan = "auto": a key the planner sets (autoPlanKeys()) that the job sets too is a ConfigError
// naming it, since one of the two would silently lose.
void rejectPlannedKeys(const Config& config);

}  // namespace chorus::runtime
