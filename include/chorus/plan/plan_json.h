// JSON form of a Plan, the file `chorus plan --json` writes and `chorus simulate --plan` reads.
//
//   {"version": 1, "model": "gpt3-1.3b", "devices": 16, "global_batch": 64, "micro_batches": 8,
//    "seed": 0, "schedule": "1f1b", "zero_stage": 1,
//    "replicas": [{"share": 8, "stages": [{"first_layer": 0, "last_layer": 14, "rank": 0,
//                                          "micro_batch": 1, "checkpoint": false}, ...]}, ...],
//    "ranks": [{"device": 0, "device_type": "A100-80", "node": "n0", "precision": "bf16",
//               "memory_budget": 0, "emulated_speed": 1, "predicted_memory": 123}, ...],
//    "comm": {"algorithm": "hierarchical", "inter_node_codec": "none", "topk_ratio": 0.01, ...
//             "bucket_mb": 25, "first_bucket_mb": 1, "min_buckets": 4, "overlap": true,
//             "sync_period": 1},
//    "predicted": {"step_seconds": ..., "samples_per_second": ..., "bubble_fraction": ...,
//                  "compute_seconds": ..., "p2p_seconds": ..., "exposed_comm_seconds": ...,
//                  "optimizer_seconds": ...},
//    "reason": "..."}
//
// `devices` is the number of ranks; `predicted` and `reason` are optional on input, and so is
// every key of `comm` (plan::CommPlan's fields; the codec's knobs are core's CodecOptions).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "chorus/plan/cluster.h"
#include "chorus/plan/plan.h"

namespace chorus::plan {

nlohmann::json toJson(const Plan& plan);
nlohmann::json toJson(const Prediction& prediction);

// Parses the JSON form; errors name the source, line and key ("plan.json:9: replicas[0].share:
// must be an integer in [1, ...]"). Checks only the form, not the plan's consistency: call
// Plan::validate and checkPlanAgainstCluster for that.
Plan parsePlanJson(const std::string& text, const std::string& source);
Plan loadPlanFile(const std::string& path);

// Throws ConfigError unless every rank's device exists in `cluster` with the type and node the
// plan names (a plan made for another cluster is rejected, not silently misread).
void checkPlanAgainstCluster(const Plan& plan, const Cluster& cluster);

}  // namespace chorus::plan
