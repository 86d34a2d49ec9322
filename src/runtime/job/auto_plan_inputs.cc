// What plan = "auto" (and `chorus plan --model JOB.toml`) plans with: the job's devices as
// measured on this host, the job's zoo model as the planner's per-layer profile, and (plan =
// "auto") that model timed on this host's CPU.
#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "chorus/core/error.h"
#include "chorus/data/text_corpus.h"
#include "chorus/device/discovery.h"
#include "chorus/device/host_sharing.h"
#include "chorus/device/microbench.h"
#include "chorus/model/zoo_model.h"
#include "chorus/runtime/job/auto_plan.h"
#include "chorus/runtime/job/compute_calibration.h"
#include "chorus/runtime/job/memory_calibration.h"
#include "job/trained_model.h"

namespace chorus::runtime {
namespace {

// Half the trials and time of `chorus devices`: the planner needs the rates to a few percent
// (they set compute against communication), and the job should not wait long to start.
device::MeasureOptions planningMeasurement() {
  device::MeasureOptions options;
  options.trials = 2;
  options.min_seconds = 0.1;
  return options;
}

}  // namespace

plan::MeasuredDevice toMeasuredDevice(const device::DeviceInfo& info,
                                      const device::DeviceMeasurement& figures) {
  plan::MeasuredDevice device;
  device.name = info.kind == DeviceKind::kCpu ? "cpu" : "cuda:" + std::to_string(info.index);
  device.description = info.name;
  device.vendor = info.vendor.empty() ? "custom" : info.vendor;
  device.device_class =
      info.kind == DeviceKind::kCpu ? plan::DeviceClass::kCpu : plan::DeviceClass::kGpu;
  device.memory_bytes = info.memory_bytes;
  device.gflops[static_cast<int>(plan::Dtype::kFp32)] = figures.matmul_gflops_fp32;
  device.gflops[static_cast<int>(plan::Dtype::kBf16)] = figures.matmul_gflops_bf16.value_or(0);
  device.gflops[static_cast<int>(plan::Dtype::kFp16)] = figures.matmul_gflops_fp16.value_or(0);
  device.memory_bandwidth_gbs = figures.mem_bandwidth_gbs;
  return device;
}

model::ModelConfig trainedModelConfig(const JobConfig& job) {
  model::ModelConfig config = job.model;
  if (job.data.dataset == "fashion-mnist") {
    config.input_shape = {1, 28, 28};
    config.classes = 10;
  } else if (job.data.dataset == "text") {
    data::TextCorpusOptions options;
    options.context = config.context;
    config.vocab = data::loadTextCorpus(job.data.path, options)->numClasses();
  }
  return config;
}

std::vector<plan::MeasuredDevice> measureJobDevices(const std::vector<DeviceSpec>& devices,
                                                    const std::vector<device::DeviceInfo>& found,
                                                    const std::vector<int>& threads) {
  std::map<std::tuple<DeviceKind, int, int>, plan::MeasuredDevice> measured;
  std::vector<plan::MeasuredDevice> result;
  for (size_t r = 0; r < devices.size(); ++r) {
    const DeviceSpec& spec = devices[r];
    CHORUS_CHECK_CONFIG(spec.kind != DeviceKind::kAuto, "measureJobDevices: expand 'auto' first");
    device::MeasureOptions options = planningMeasurement();
    if (spec.kind == DeviceKind::kCpu && r < threads.size()) options.threads = threads[r];
    const auto key = std::make_tuple(spec.kind, spec.index, options.threads);
    if (!measured.count(key)) {
      const device::DeviceInfo* info = nullptr;
      for (const auto& candidate : found)
        if (candidate.kind == spec.kind && candidate.index == spec.index) info = &candidate;
      CHORUS_CHECK_CONFIG(info, "device spec '", spec.toString(), "' matches no local device");
      measured[key] = toMeasuredDevice(*info, device::measureDevice(*info, options));
    }
    result.push_back(measured[key]);
  }
  return result;
}

std::vector<int> jobThreads(const JobConfig& job, const std::vector<DeviceSpec>& devices,
                            const std::vector<device::DeviceInfo>& found) {
  int cores = 1;
  for (const device::DeviceInfo& info : found)
    if (info.kind == DeviceKind::kCpu) cores = std::max(1, info.cores);
  return device::intraOpThreads(devices, cores, static_cast<int>(job.cpu_threads));
}

std::vector<double> measureStartRates(const JobConfig& job,
                                      const std::vector<DeviceSpec>& devices) {
  const BalancerSection& balancer = job.balancer;
  const bool shares_by_speed =
      balancer.mode != "off" && balancer.shares.empty() && balancer.initial_shares.empty();
  const bool slices_by_speed = job.zero.stage >= 1 && job.zero.shards == "speed";
  if (!(shares_by_speed || slices_by_speed) || job.parallel.pipeline_stages > 1 || devices.empty())
    return {};
  bool mixed = false;
  for (const DeviceSpec& device : devices)
    mixed = mixed || device.kind != devices[0].kind || device.index != devices[0].index;
  if (!mixed) return {};
  const std::vector<device::DeviceInfo> found = device::discoverDevices();
  for (const DeviceSpec& spec : devices) {
    const bool local = std::any_of(found.begin(), found.end(), [&](const auto& info) {
      return info.kind == spec.kind && info.index == spec.index;
    });
    if (!local) return {};
  }
  const std::vector<plan::MeasuredDevice> measured =
      measureJobDevices(devices, found, jobThreads(job, devices, found));
  std::vector<double> rates;
  for (size_t r = 0; r < devices.size(); ++r) {
    const std::string format = precisionOf(job.precision, static_cast<int>(r), devices[r]);
    // TF32 is not measured for the planner (toMeasuredDevice): fp32 ranks count at fp32.
    const plan::Dtype dtype = plan::parseDtype(format);
    double rate = measured[r].gflops[static_cast<int>(dtype)];
    if (rate <= 0) rate = measured[r].gflops[static_cast<int>(plan::Dtype::kFp32)];
    rates.push_back(rate);
  }
  return rates;
}

std::optional<ComputeCalibration> autoPlanCalibration(
    const JobConfig& job, const std::vector<DeviceSpec>& devices,
    const std::vector<plan::MeasuredDevice>& measured, const std::vector<int>& threads) {
  CHORUS_CHECK_CONFIG(measured.size() == devices.size(), "autoPlanCalibration: ", measured.size(),
                      " measured devices for ", devices.size(), " device specs");
  for (size_t r = 0; r < devices.size(); ++r) {
    if (devices[r].kind != DeviceKind::kCpu) continue;
    ComputeCalibrationOptions options = ComputeCalibrationOptions::forJob(
        job.train.global_batch, r < threads.size() ? threads[r] : 1);
    // The device's own measurement, before its emulated speed scales it (planJob's cluster
    // applies the speed to the rate and the efficiency alike).
    options.matmul_gflops = measured[r].gflops[static_cast<int>(plan::Dtype::kFp32)];
    return calibrateJobCompute(job, options);
  }
  return std::nullopt;
}

// The planner's profile of the job's model is the calibrated one, so its memory predictions are
// those of the pipeline cut and the trainers' micro-batch sizing (memory_calibration.h).
plan::ModelProfile jobModelProfile(const JobConfig& job, const std::string& name) {
  return calibratedProfile(trainedModelConfig(job), job.seed, name);
}

}  // namespace chorus::runtime
