#include "chorus/runtime/job/compute_calibration.h"

#include <ATen/ATen.h>
#include <malloc.h>
#include <torch/autograd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>

#include "chorus/core/error.h"
#include "chorus/device/discovery.h"
#include "chorus/device/microbench.h"
#include "chorus/model/zoo_model.h"
#include "job/trained_model.h"

namespace chorus::runtime {
namespace {

// Keeps the memory a pass frees in the heap for the next pass, as a training worker's heap does
// (its data loader's allocations sit above a step's activations). Otherwise glibc returns the
// freed top of the heap to the kernel after every pass (its trim threshold follows the largest
// freed block), and the next pass faults every page of its activations back in: a CNN's pass
// timed that way took 1.75 times as long as the same pass in a worker. glibc cannot put its
// adaptive thresholds back, so the process keeps these: at most the largest pass's memory stays
// with it.
void keepFreedMemoryForTheNextPass() {
  constexpr int kLargestHeapBlock = 32 << 20;  // glibc's ceiling; larger blocks are mapped apart
  constexpr int kKeptAtTheTop = 1 << 30;
  mallopt(M_MMAP_THRESHOLD, kLargestHeapBlock);
  mallopt(M_TRIM_THRESHOLD, kKeptAtTheTop);
}

// The fastest of `repeats` forward + backward passes over `batch`, after one warm-up.
double fastestStep(model::ZooModel& model, const SyntheticBatch& batch, int repeats) {
  double fastest = std::numeric_limits<double>::infinity();
  for (int r = 0; r <= repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    const at::Tensor loss = model.lossSum(model.forward(batch.inputs), batch.targets);
    loss.backward();
    model.zero_grad(/*set_to_none=*/true);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (r > 0) fastest = std::min(fastest, seconds);
  }
  return fastest;
}

double cpuMatmulGflops(int threads) {
  for (const device::DeviceInfo& info : device::discoverDevices()) {
    if (info.kind != DeviceKind::kCpu) continue;
    device::MeasureOptions options;
    options.threads = threads;
    options.trials = 2;
    options.min_seconds = 0.1;
    return device::measureDevice(info, options).matmul_gflops_fp32;
  }
  CHORUS_THROW(ConfigError, "compute calibration: this host lists no CPU device");
}

}  // namespace

ComputeCalibrationOptions ComputeCalibrationOptions::forJob(std::int64_t global_batch,
                                                            int threads) {
  ComputeCalibrationOptions options;
  options.threads = threads;
  options.batch = std::clamp<std::int64_t>(global_batch, 4, kMaxTimedBatch);
  return options;
}

double ComputeCalibration::secondsPerSample() const {
  return (large_seconds - small_seconds) / static_cast<double>(large_batch - small_batch);
}

double ComputeCalibration::efficiency(const plan::ModelProfile& profile) const {
  double forward_flops = 0;
  for (const plan::LayerProfile& layer : profile.layers) forward_flops += layer.forward_flops;
  return 3 * forward_flops / (secondsPerSample() * matmul_gflops * 1e9);
}

double ComputeCalibration::layerOverheadSeconds(const plan::ModelProfile& profile) const {
  const double fixed = small_seconds - secondsPerSample() * static_cast<double>(small_batch);
  return std::max(0.0, fixed / (3.0 * profile.layerCount()));
}

ComputeCalibration calibrateCompute(const model::ModelConfig& config, std::uint64_t seed,
                                    const ComputeCalibrationOptions& options) {
  CHORUS_CHECK_CONFIG(options.threads >= 1 && options.batch >= 2 && options.repeats >= 1 &&
                          options.matmul_gflops >= 0,
                      "compute calibration: threads >= 1, batch >= 2, repeats >= 1 and "
                      "matmul_gflops >= 0");
  ComputeCalibration result;
  result.large_batch = options.batch;
  result.small_batch = std::max<std::int64_t>(1, options.batch / 4);
  const device::ScopedIntraOpThreads threads(options.threads);
  keepFreedMemoryForTheNextPass();
  // The model's initialization and the matmul benchmark's operands draw from it.
  const GeneratorGuard generator;
  {
    const auto model = model::makeModel(config, seed);
    model->train();
    result.small_seconds =
        fastestStep(*model, syntheticBatch(config, result.small_batch), options.repeats);
    result.large_seconds =
        fastestStep(*model, syntheticBatch(config, result.large_batch), options.repeats);
  }
  result.matmul_gflops =
      options.matmul_gflops > 0 ? options.matmul_gflops : cpuMatmulGflops(options.threads);
  CHORUS_CHECK_CONFIG(result.secondsPerSample() > 0 && result.matmul_gflops > 0,
                      "compute calibration: ", result.large_batch, " samples took ",
                      result.large_seconds, " s, ", result.small_batch, " took ",
                      result.small_seconds,
                      " s: no time per sample to calibrate with (a host too busy to measure)");
  return result;
}

ComputeCalibration calibrateJobCompute(const JobConfig& job,
                                       const ComputeCalibrationOptions& options) {
  return calibrateCompute(trainedModelConfig(job), job.seed, options);
}

void applyComputeCalibration(plan::CostOptions& cost, const ComputeCalibration& calibration,
                             const plan::ModelProfile& profile,
                             const std::vector<std::string>& cpu_types, bool set_layer_overhead) {
  const double efficiency = calibration.efficiency(profile);
  for (const std::string& type : cpu_types)
    cost.calibrations.push_back({type, plan::Dtype::kFp32, efficiency});
  if (set_layer_overhead) cost.layer_overhead_seconds = calibration.layerOverheadSeconds(profile);
}

std::string describeCalibration(const ComputeCalibration& calibration,
                                const plan::ModelProfile& profile) {
  char line[160];
  std::snprintf(line, sizeof line,
                "calibrated on this host: %.2f x the matmul rate (%.1f GFLOP/s), %.0f us per layer",
                calibration.efficiency(profile), calibration.matmul_gflops,
                calibration.layerOverheadSeconds(profile) * 1e6);
  return line;
}

}  // namespace chorus::runtime
