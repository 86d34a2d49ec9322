// What `chorus plan` and `chorus simulate` read besides the cluster: the model (a named shape, a
// JSON profile, or a `chorus train` job file whose zoo model is profiled here, so the planner
// prices exactly the model a run trains) and calibrations of the cost model's efficiencies.
#pragma once

#include <string>
#include <vector>

#include "chorus/plan/cluster.h"
#include "chorus/plan/cost_model.h"
#include "chorus/plan/model_profile.h"

namespace CLI {
class App;
}  // namespace CLI

namespace chorus::cli {

// The measured figures `chorus plan` and `chorus simulate` both take for the cost model
// (docs/planner.md, "The cost model"). Value type; defaults are the cost model's.
struct CostFlags {
  std::vector<std::string> calibrations;  // --calibration TYPE[:DTYPE]=E, repeatable
  double step_overhead_ms = 0;            // --step-overhead-ms
  double layer_overhead_us = 30;          // --layer-overhead-us
  double host_us_per_sample = 0;          // --host-us-per-sample
  double codec_ns_per_byte = 0;           // --codec-ns-per-byte
};

// Registers the CostFlags options on `command`; `flags` must outlive the parse.
void addCostFlags(CLI::App& command, CostFlags& flags);

// The cost model's options those flags describe, calibrations checked against `cluster`.
// Throws ConfigError.
plan::CostOptions costOptions(const CostFlags& flags, const plan::Cluster& cluster);

// A named shape or `*.json` profile (plan::resolveModel), or a job file `*.toml` of `chorus
// train`: its [model] completed from its [data] as the trainer does (input shape and classes of
// Fashion-MNIST, the vocabulary of a text corpus), built, and its per-layer profile converted. The
// profile is named by the path, so a plan made from it finds the same model again. Throws
// ConfigError.
plan::ModelProfile resolvePlanModel(const std::string& name_or_path);

// Calibrations "TYPE[:DTYPE]=EFFICIENCY" (DTYPE defaults to fp32; TYPE "*" means every type of
// `cluster`), e.g. "*=0.45" or "cpu@0.5:bf16=0.3". Throws ConfigError on a malformed entry, an
// efficiency outside (0, 4] (above 1 only makes sense for measured types) or a type the cluster
// lacks.
std::vector<plan::Calibration> parseCalibrations(const std::vector<std::string>& entries,
                                                 const plan::Cluster& cluster);

}  // namespace chorus::cli
