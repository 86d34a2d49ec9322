// The job's [zero] section: ZeRO's stage and how its shards are sized, and what a sharded step
// does not combine with yet — refused here, before any worker starts, rather than ignored. The
// shard fractions of a job on its devices are in zero_shards.cc.
#include <cmath>
#include <string>

#include "chorus/core/error.h"
#include "job/job_sections.h"

namespace chorus::runtime {
namespace {

std::vector<double> readFractions(const Config& config) {
  const std::vector<double> fractions = config.getDoubles("zero.shards", {});
  require(!fractions.empty(), "zero.shards", "an empty list; give one fraction per rank");
  double total = 0;
  for (double fraction : fractions) {
    require(fraction >= 0 && fraction <= 1, "zero.shards",
            "every fraction must be in [0, 1], got " + std::to_string(fraction));
    total += fraction;
  }
  require(std::abs(total - 1) <= 1e-6, "zero.shards",
          "the fractions sum to " + std::to_string(total) + ", not 1");
  return fractions;
}

}  // namespace

ZeroSection readZero(const Config& config) {
  ZeroSection zero;
  zero.stage = config.getInt("zero.stage", zero.stage);
  zero.stage_given = config.has("zero.stage");
  require(zero.stage >= 0 && zero.stage <= 3, "zero.stage", "must be 0, 1, 2 or 3");
  if (config.isArray("zero.shards")) {
    zero.shards = "list";
    zero.fractions = readFractions(config);
  } else {
    zero.shards = config.getString("zero.shards", zero.shards);
    require(zero.shards == "memory" || zero.shards == "even" || zero.shards == "speed",
            "zero.shards",
            "'" + zero.shards +
                "' is unknown; expected \"memory\", \"even\", \"speed\" or a list of fractions");
  }
  require(zero.stage >= 1 || !config.has("zero.shards"), "zero.shards",
          "needs zero.stage >= 1 (stage 0 replicates everything)");
  zero.redundancy = config.getInt("zero.redundancy", zero.redundancy);
  require(zero.redundancy == 0 || zero.redundancy == 1, "zero.redundancy", "must be 0 or 1");
  require(zero.stage >= 1 || zero.redundancy == 0, "zero.redundancy",
          "needs zero.stage >= 1 (stage 0 replicates everything)");
  return zero;
}

void checkZero(const JobConfig& job) {
  const ZeroSection& zero = job.zero;
  if (zero.stage == 0) return;
  // The replicas serve elastic recovery alone (a checkpoint holds every slice anyway).
  require(zero.redundancy == 0 || job.elastic.enabled, "zero.redundancy",
          "needs elastic.enabled = true (the replicas serve only elastic recovery)");
  const std::string with = "cannot be combined with zero.stage = " + std::to_string(zero.stage);
  require(job.parallel.pipeline_stages == 1, "parallel.pipeline_stages",
          with + " (ZeRO shards the data-parallel ranks of one-stage replicas)");
  require(job.comm.sync_every == 1, "comm.sync_every",
          with + " (local SGD keeps whole optimizer states on every rank)");
  // Stage 2 reduce-scatters each bucket with one collective over all ranks: no hierarchy, and
  // only codecs whose sum can be formed in their own format (fp16, bf16).
  require(zero.stage < 2 || job.comm.algorithm == "flat", "comm.algorithm",
          with + " (its gradient reduce-scatter is flat); set comm.algorithm = \"flat\"");
  const std::string& codec = job.comm.compression;
  require(zero.stage < 2 || codec == "none" || codec == "fp16" || codec == "bf16",
          "comm.compression",
          with + " (its gradient reduce-scatter sums in the codec's format: fp16 or bf16, not " +
              codec + ")");
  const bool automatic = job.devices.size() == 1 && job.devices[0].kind == DeviceKind::kAuto;
  require(zero.shards != "list" || automatic || zero.fractions.size() == job.devices.size(),
          "zero.shards",
          std::to_string(zero.fractions.size()) + " fractions for " +
              std::to_string(job.devices.size()) + " devices");
}

}  // namespace chorus::runtime
