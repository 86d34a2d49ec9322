// plan = "auto" (docs/planner.md, "Planning a chorus train job"): the planner prices the job's
// model on its measured devices and returns the Plan the job then runs as it is.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "chorus/core/device_spec.h"
#include "chorus/device/discovery.h"
#include "chorus/plan/local_cluster.h"
#include "chorus/plan/model_profile.h"
#include "chorus/plan/plan.h"
#include "chorus/runtime/job/compute_calibration.h"
#include "chorus/runtime/job/job_config.h"

namespace chorus::device {
struct DeviceInfo;
struct DeviceMeasurement;
}  // namespace chorus::device

namespace chorus::runtime {

// The keys plan = "auto" sets; with plan = "auto" a job must not set them itself.
const std::vector<std::string>& autoPlanKeys();

// What the planner chose for a job. Value type.
struct PlannedJob {
  // One line for the log: what was chosen, its predicted step time and why it won.
  std::string summary;
  // The chosen plan with its prediction and reason, as the planner made it (ranks[r].device
  // indexes the job's devices in their listed order; adoptPlan puts it in rank order), each rank
  // computing in the format the job's [precision] gives its device.
  plan::Plan plan;
};

// Measures the devices `devices` name among this host's, `found` (device::discoverDevices;
// device/microbench.h; each physical device once per thread count, about a second for a CPU):
// entry i describes devices[i] as it is, without its emulated speed or budget, a CPU at
// `threads[i]` intra-op threads (Default: empty, one each; jobThreads gives a job's). REQUIRES: no
// "auto" left in `devices` (device::expandAuto). Throws DeviceError when a measurement fails.
std::vector<plan::MeasuredDevice> measureJobDevices(const std::vector<DeviceSpec>& devices,
                                                    const std::vector<device::DeviceInfo>& found,
                                                    const std::vector<int>& threads = {});

// The intra-op threads each of `devices`, one node's, computes on in `job`
// (device::intraOpThreads with JobConfig::cpu_threads and the node's cores in `found`).
std::vector<int> jobThreads(const JobConfig& job, const std::vector<DeviceSpec>& devices,
                            const std::vector<device::DeviceInfo>& found);

// The device rates planOfJob starts a data-parallel job's shares from (job_plan.h): each
// device's measured matmul rate in its rank's compute format (measureJobDevices), when the job
// mixes device kinds or GPUs and its balancer starts from speeds (not `balance = "off"`, fixed
// or initial shares, nor a pipeline) or it sizes ZeRO's slices by speed (zero.shards = "speed").
// Empty otherwise, also when a device is not on this host (another node's), so that emulated speeds
// alone set the start. Throws DeviceError when a measurement fails.
std::vector<double> measureStartRates(const JobConfig& job, const std::vector<DeviceSpec>& devices);

// One local device and its measured figures in the planner's terms (description = the device's
// name), as plan = "auto" and `chorus devices --cluster-toml` both describe this node.
plan::MeasuredDevice toMeasuredDevice(const device::DeviceInfo& info,
                                      const device::DeviceMeasurement& figures);

// The model `job` trains, completed from its data set as the trainer does (Fashion-MNIST's shape
// and classes, the text corpus's vocabulary), as the planner's per-layer profile named `name`.
// Throws ConfigError (e.g. a missing corpus).
plan::ModelProfile jobModelProfile(const JobConfig& job, const std::string& name);

// The job's model timed on this host's CPU (compute_calibration.h) at the threads of its first CPU
// worker, against the matmul rate measureJobDevices measured at those threads (`measured`, in
// the order of `devices`): what plan = "auto" prices its CPU workers with. Empty when the job has
// no CPU worker. Throws ConfigError when the timing gives no time per sample.
std::optional<ComputeCalibration> autoPlanCalibration(
    const JobConfig& job, const std::vector<DeviceSpec>& devices,
    const std::vector<plan::MeasuredDevice>& measured, const std::vector<int>& threads);

// Plans `job` on this node: devices[i] (expanded specs) with measured figures measured[i]
// becomes one device of a local cluster (plan/local_cluster.h; rates times the emulated speed),
// the model jobModelProfile(job), the batch train.global_batch; the search covers what the
// trainers run: data parallelism with uneven shares, and pipelines or replicas x pipelines when
// nothing in the job rules them out (see docs/planner.md). CPU workers are priced with
// `calibration` where one is given (compute_calibration.h; the summary then says so; `chorus
// train` gives autoPlanCalibration's), else with the cost model's defaults. Throws ConfigError
// when nothing fits.
PlannedJob planJob(const JobConfig& job, const std::vector<DeviceSpec>& devices,
                   const std::vector<plan::MeasuredDevice>& measured,
                   const std::optional<ComputeCalibration>& calibration = std::nullopt);

}  // namespace chorus::runtime
