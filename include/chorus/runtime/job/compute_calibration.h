// The cost model calibrated on this host for the job's own model: what plan = "auto" and `chorus
// plan --calibrate` price CPU workers with instead of the defaults (docs/planner.md,
// "Validation").
//
// The cost model charges a CPU worker, per layer and pass, a fixed overhead plus the layer's FLOPs
// at an efficiency of its measured matmul rate (plan/cost_model.h). Both depend on the model and
// the host's libtorch: a small MLP's layers spend much of their time outside matmuls, a CNN's
// convolutions may run above the matmul rate. So the model itself is timed, forward and backward
// on synthetic batches of two sizes, and the line through the two times gives the efficiency
// (from its slope, against the matmul rate measured alongside with the same threads) and the
// overhead per layer and pass (from where it meets zero samples), as bench/plan_validation.py's
// calibrated prediction does from separate training runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "chorus/model/model_config.h"
#include "chorus/plan/cost_model.h"
#include "chorus/plan/model_profile.h"
#include "chorus/runtime/job/job_config.h"

namespace chorus::runtime {

struct ComputeCalibrationOptions {
  // What plan = "auto" and `chorus plan --calibrate` time for a job of `global_batch` samples at
  // `threads`: the global batch, at least 4 and at most kMaxTimedBatch (the front end's start-up
  // stays short however large the batch; the line is as straight past it).
  static ComputeCalibrationOptions forJob(std::int64_t global_batch, int threads);
  static constexpr std::int64_t kMaxTimedBatch = 256;

  // Intra-op threads of the timing and of the matmul rate it is set against: a CPU worker's.
  // Default: 1.
  int threads = 1;
  // The larger batch timed; the smaller is a quarter of it (at least 1). Default: 32.
  std::int64_t batch = 32;
  // Timed repetitions of each size after one warm-up; the fastest counts, as the least disturbed
  // by other processes (device::measureDevice's rule for the matmul rate). Default: 5.
  int repeats = 5;
  // The fp32 matmul rate at `threads` in GFLOP/s, when it was measured already (plan = "auto"
  // measured the job's devices); 0 measures it here. Default: 0.
  double matmul_gflops = 0;
};

// A model's forward + backward on this host's CPU in fp32 at two batch sizes, and the fp32 matmul
// rate at the same threads. Value type.
struct ComputeCalibration {
  std::int64_t small_batch = 0, large_batch = 0;
  double small_seconds = 0, large_seconds = 0;
  double matmul_gflops = 0;

  // Seconds per sample: the slope between the two batches.
  double secondsPerSample() const;
  // The model's FLOP/s (forward once, backward twice: 3 x `profile`'s forward FLOPs per sample)
  // over the matmul rate; may exceed 1.
  double efficiency(const plan::ModelProfile& profile) const;
  // What the line leaves at zero samples, per layer and pass (3 per layer), at least 0.
  double layerOverheadSeconds(const plan::ModelProfile& profile) const;
};

// Times `config` (built with `seed`; the process's random stream is left as found) as the header
// says. Throws ConfigError when the timings give no positive slope (a host too busy to measure).
ComputeCalibration calibrateCompute(const model::ModelConfig& config, std::uint64_t seed,
                                    const ComputeCalibrationOptions& options = {});

// calibrateCompute for the model `job` trains (its [model] completed from its [data]).
ComputeCalibration calibrateJobCompute(const JobConfig& job,
                                       const ComputeCalibrationOptions& options = {});

// `cost` with `calibration` of the model `profile` applied to the CPU device types named
// `cpu_types` in fp32, and its layer overhead when `set_layer_overhead` (a cluster of CPU workers
// only: the overhead is one figure for every device).
void applyComputeCalibration(plan::CostOptions& cost, const ComputeCalibration& calibration,
                             const plan::ModelProfile& profile,
                             const std::vector<std::string>& cpu_types, bool set_layer_overhead);

// One line for the log: "calibrated on this host: 1.31 x the matmul rate (95.2 GFLOP/s), 42 us
// per layer".
std::string describeCalibration(const ComputeCalibration& calibration,
                                const plan::ModelProfile& profile);

}  // namespace chorus::runtime
