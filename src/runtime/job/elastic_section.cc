// The job's [elastic] section: whether survivors recover from a lost worker, how a loss is
// detected, and how often a lost worker is replaced; and what recovery cannot do yet, refused here
// rather than ignored.
#include <string>

#include "chorus/core/config_section.h"
#include "chorus/core/error.h"
#include "job/job_sections.h"

namespace chorus::runtime {

ElasticSection readElastic(const Config& config) {
  ElasticSection elastic;
  readSection(config, "elastic",
              {{"enabled", elastic.enabled},
               {"min_devices", elastic.min_devices},
               {"heartbeat_ms", elastic.heartbeat_ms},
               {"heartbeat_misses", elastic.heartbeat_misses},
               {"max_restarts", elastic.max_restarts}});
  require(elastic.min_devices >= 1, "elastic.min_devices", "must be at least 1");
  // Below 50 ms a busy store or a descheduled monitor thread would look like a lost worker.
  require(elastic.heartbeat_ms >= 50, "elastic.heartbeat_ms", "must be at least 50");
  require(elastic.heartbeat_misses >= 1, "elastic.heartbeat_misses", "must be at least 1");
  require(elastic.max_restarts >= 0, "elastic.max_restarts", "must be at least 0");
  for (const char* key : {"elastic.min_devices", "elastic.heartbeat_ms", "elastic.heartbeat_misses",
                          "elastic.max_restarts"})
    require(elastic.enabled || !config.has(key), key, "needs elastic.enabled = true");
  return elastic;
}

void checkElastic(const JobConfig& job) {
  const ElasticSection& elastic = job.elastic;
  if (!elastic.enabled) return;
  const std::string with = "cannot be combined with elastic.enabled = true";
  // A lost stage's layers are held by no survivor of its replica: the survivors re-cut the model
  // over themselves and restore the last checkpoint (written before the first step too).
  require(job.parallel.pipeline_stages == 1 || !job.checkpoint.dir.empty(),
          "parallel.pipeline_stages",
          "with elastic.enabled = true needs checkpoint.dir: a lost stage's layers come back only "
          "from the last checkpoint");
  // A lost rank's ZeRO slice exists nowhere else: the survivors go back to the last checkpoint
  // (the job writes one at its first step), so there must be somewhere to write them.
  require(job.zero.stage == 0 || !job.checkpoint.dir.empty(), "zero.stage",
          "with elastic.enabled = true needs checkpoint.dir: a lost rank's ZeRO slice comes back "
          "only from the last checkpoint");
  require(job.comm.sync_every == 1, "comm.sync_every",
          with + " (under local SGD the replicas differ between averages, so no survivor " +
              "holds the state of a lost one)");
  require(job.balancer.shares.empty() ||
              static_cast<std::int64_t>(job.balancer.shares.size()) >= elastic.min_devices,
          "elastic.min_devices", "is more than the devices balancer.shares lists");
  const bool automatic = job.devices.size() == 1 && job.devices[0].kind == DeviceKind::kAuto;
  require(automatic || static_cast<std::int64_t>(job.devices.size()) >= elastic.min_devices,
          "elastic.min_devices",
          std::to_string(elastic.min_devices) + " is more than the job's " +
              std::to_string(job.devices.size()) + " devices");
}

}  // namespace chorus::runtime
