// The job's memory model, calibrated by measurement: the runtime's side of plan/memory_model.h.
//
// The zoo's analytic profiles give each layer's parameters, FLOPs and output bytes, but not what
// autograd keeps for the backward pass (inputs, pre-activations, attention scores, normalization
// statistics, masks) nor what a layer's backward allocates for a moment: that depends on libtorch's
// kernels. So every layer is run once, forward and backward on two small batches, with its
// allocations charged to a MemoryAccount of the counting allocator (device/memory_meter.h); the
// difference per sample gives LayerProfile::activation_bytes and workspace_bytes (the fixed
// parameter gradients cancel out). The last layer's figures include the loss (log-softmax); the
// batch itself (inputs and targets) is ModelProfile::input_bytes. The result is a
// plan::ModelProfile, so the planner, the pipeline cut and the micro-batch sizing all read one and
// the same model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chorus/core/device_spec.h"
#include "chorus/model/model_config.h"
#include "chorus/plan/memory_model.h"
#include "chorus/plan/model_profile.h"
#include "chorus/runtime/job/job_config.h"

namespace chorus::runtime {

// The profile of the zoo model `config` (built with `seed`) with its memory figures measured.
// Deterministic on one machine: the measurement uses synthetic inputs of the model's shape, a
// model of its own, and leaves the process's random generator as it found it. Safe to call from
// several threads (measurements run one at a time: the counting allocator is process-wide). Uses
// the installed MemoryMeter when there is one, else installs one for the measurement.
plan::ModelProfile calibratedProfile(const model::ModelConfig& config, std::uint64_t seed,
                                     const std::string& name);

// Bytes of optimizer state per parameter of the job's optimizer (plan::MemoryOptions).
double optimizerStateBytes(const OptimizerSection& optimizer);

// The job's memory model: its trained model's calibrated profile and its optimizer.
plan::MemoryModel jobMemoryModel(const JobConfig& job);

// jobMemoryModel(job) when one of `devices` has a memory budget, else null (nothing to check,
// and no measurement to pay for).
std::shared_ptr<const plan::MemoryModel> memoryModelForBudgets(
    const JobConfig& job, const std::vector<DeviceSpec>& devices);

// Puts the job's measured memory profile into `plan` (Plan::memory_profile) when one of its
// devices has a memory budget and the plan carries none yet, so that the workers read it rather
// than measure the model again.
void attachMemoryProfile(plan::Plan& plan, const JobConfig& job,
                         const std::vector<DeviceSpec>& devices);

// The memory model a worker sizes against for `job` running `plan`: the plan's profile with the
// job's optimizer where the plan carries one, else jobMemoryModel(job) (measured now).
plan::MemoryModel planMemoryModel(const JobConfig& job, const plan::Plan& plan);

// planMemoryModel when one of `devices` has a memory budget, else null.
std::shared_ptr<const plan::MemoryModel> planMemoryModelForBudgets(
    const JobConfig& job, const plan::Plan& plan, const std::vector<DeviceSpec>& devices);

}  // namespace chorus::runtime
