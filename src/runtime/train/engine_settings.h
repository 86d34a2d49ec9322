// Private to runtime: the gradient reducer's settings from the plan and the loss scaler's from the
// job, as both engines use them: the data-parallel trainer for its all-reduce, the pipeline engine
// for each stage's all-reduce across the replicas; each fp16 rank's scaler. One reading, so the
// same keys mean the same thing; and their state in a rank's checkpoint archive, under the same
// names.
#pragma once

#include <memory>

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "chorus/parallel/compression.h"
#include "chorus/parallel/gradient_reducer.h"
#include "chorus/parallel/loss_scaler.h"
#include "chorus/plan/plan.h"
#include "chorus/runtime/job/job_config.h"

namespace chorus::runtime {

// Bucket sizes and overlap from the plan's `comm` (bucket_mb, first_bucket_mb, min_buckets,
// overlap); nothing else set.
parallel::ReducerOptions reducerBuckets(const plan::CommPlan& comm);

// The plan's gradient codec (CommPlan::codec), or null for none.
std::shared_ptr<parallel::GradientCodec> planCodec(const plan::CommPlan& comm);

// The loss scaler of an fp16 rank on a device of `kind`: precision.loss_scale.cuda for CUDA,
// precision.loss_scale.cpu otherwise. A GPU of compute capability `compute_capability` ("7.0";
// empty when unknown) below 8 starts at 2^12 unless the job set the initial scale.
parallel::LossScalerOptions lossScalerOptions(const PrecisionSection& section, DeviceKind kind,
                                              const std::string& compute_capability = "");

// The compute capability of CUDA device `index` as libtorch reports it ("9.0"), or "" when this
// build cannot read it.
std::string cudaComputeCapability(int index);

// A scaler's state as "loss_scale" ([scale, clean steps], double).
void writeScalerState(torch::serialize::OutputArchive& archive,
                      const parallel::DynamicLossScaler& scaler);
// Loads it when the archive has it (an archive of an fp32 rank has none).
void readScalerState(torch::serialize::InputArchive& archive, parallel::DynamicLossScaler& scaler);

// A codec's state (error-feedback memory, PowerSGD factors) as "codec/<key>".
void writeCodecState(torch::serialize::OutputArchive& archive,
                     const parallel::GradientCodec& codec);
void readCodecState(torch::serialize::InputArchive& archive, parallel::GradientCodec& codec);

}  // namespace chorus::runtime
