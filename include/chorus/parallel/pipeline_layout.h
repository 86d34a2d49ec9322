// Pipeline jobs: their options, where each rank sits (replica, stage), and where the model is cut.
//
// A job of R replicas × S stages has R·S ranks; rank = replica · S + stage, so a replica's stages
// are consecutive ranks. Every replica is cut at the same layers (the per-stage gradient
// all-reduce across replicas needs the same parameters at the same stage index) and takes its own
// share of each global batch; shares may differ. Cuts are "even" (equal layer counts), explicit
// ("3,2,1": layers per stage), or "auto": plan::partitionLayers balances per-micro-batch stage
// times for each stage's device speed, priced by the planner's own time model (plan::CostModel,
// plan/cost_model.h, so the cut and the planner agree on what a layer costs), and keeps each stage
// within its device's memory by the memory model (plan/memory_model.h). Every rank computes the
// same cuts from the same inputs, so no message is needed to agree on them.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chorus/model/zoo_model.h"
#include "chorus/parallel/pipeline_schedule.h"
#include "chorus/parallel/precision.h"
#include "chorus/plan/cost_model.h"
#include "chorus/plan/device_catalog.h"
#include "chorus/plan/memory_model.h"

namespace chorus::parallel {

// What a stage keeps between a micro-batch's forward and its backward: the Plan's vocabulary
// (plan/memory_model.h: kNone, kStage, kLayer; plan::toString, plan::parseCheckpointing).
using plan::Checkpointing;

// The job's pipeline options; the runtime maps its config onto them. Value type.
struct PipelineOptions {
  // Stages per replica (S). Default: 1.
  int pipeline_stages = 1;
  // Default: 1F1B (same bubble as GPipe, at most S - s micro-batches held on stage s).
  Schedule schedule = Schedule::kOneFOneB;
  // Micro-batches per step and replica (M); each replica's share is split into M nearly equal
  // parts, so every share must be >= M. Default: 1.
  int micro_batches = 1;
  // "auto", "even", or explicit layer counts per stage such as "3,2,1". Default: "auto".
  std::string partition = "auto";
  // Data-parallel pipeline replicas (R). Default: 1.
  int replicas = 1;
  // Samples of every global batch (B). REQUIRED: > 0.
  std::int64_t global_batch = 0;
  // Samples per replica, summing to global_batch. Default: empty, meaning as equal as possible
  // (the first replicas take the remainder).
  std::vector<std::int64_t> replica_shares;
  // Default: kNone.
  Checkpointing activation_checkpointing = Checkpointing::kNone;
  // Deadline of each transfer and all-reduce. Default: 0, meaning the communicator's own.
  std::chrono::milliseconds timeout{0};
  // The format THIS rank's stage computes in (ranks may differ): its forward, and a checkpointed
  // backward's recompute, run under autocast; parameters, optimizer state and gradients stay
  // fp32, as in data parallelism (precision.h). Default: fp32.
  Precision precision = Precision::kFp32;
  // Activations cross to the next stage in the sender's compute format (false) or in fp32
  // (true); each arrives as fp32 at the receiver's first layer either way. Default: false, the
  // compute format (half the bytes from a 16-bit stage).
  bool fp32_transfers = false;
};

// Throws ConfigError naming the field unless `options` can run on a model of `layers` layers.
void validatePipelineOptions(const PipelineOptions& options, std::int64_t layers);

// The shares of options (replica_shares, or the equal split of global_batch).
std::vector<std::int64_t> replicaShares(const PipelineOptions& options);

// Sizes of the `micro_batches` micro-batches of `share` samples: as equal as possible, the first
// ones one larger. REQUIRES: share >= micro_batches >= 1 (ConfigError).
std::vector<std::int64_t> microBatchSizes(std::int64_t share, int micro_batches);

// Where a rank sits. Value type.
struct StagePosition {
  int replica = 0;
  int stage = 0;
};

// The rank ↔ (replica, stage) mapping of R × S ranks. Value type.
class PipelineLayout {
 public:
  // REQUIRES: replicas >= 1, stages >= 1 (ConfigError).
  PipelineLayout(int replicas, int stages);

  int replicas() const { return replicas_; }
  int stages() const { return stages_; }
  int worldSize() const { return replicas_ * stages_; }
  int rankOf(int replica, int stage) const { return replica * stages_ + stage; }
  // ConfigError when rank is not in [0, worldSize()).
  StagePosition positionOf(int rank) const;
  // The ranks running stage `stage`, one per replica, ascending: its gradient all-reduce group.
  std::vector<int> stageGroup(int stage) const;

 private:
  int replicas_;
  int stages_;
};

// One rank's device as the cut sees it. Value type.
struct StageDevice {
  // Relative compute speed: the device computes in 1 / speed of the time of CutRequest::reference
  // (the speed emulator pads every compute phase so). Default: 1.0.
  double speed = 1.0;
  // Memory the stage may use, in bytes. Default: 0, meaning unlimited.
  std::uint64_t memory_bytes = 0;
};

// Everything the cut depends on; every rank must pass the same. Value type.
struct CutRequest {
  std::vector<model::LayerProfile> profile;
  PipelineOptions options;
  // devices[replica][stage]. Empty: every device is StageDevice{}.
  std::vector<std::vector<StageDevice>> devices;
  // The device of speed 1.0 and the cost model's options, with which plan::CostModel prices a
  // stage (stageSeconds). Only ratios of stage times choose a cut, but the cost model's fixed
  // per-layer overhead and its roofline make them depend on the absolute rates, so the reference
  // should be the kind of device the job runs on. Default: the catalog's "CPU" and CostOptions{}.
  plan::DeviceType reference = *plan::findDeviceType("CPU");
  plan::CostOptions cost;
  // The job's memory model, which the cut asks whether a stage fits its device's memory_bytes.
  // REQUIRED when a device has memory_bytes > 0 (ConfigError otherwise); may be null else.
  std::shared_ptr<const plan::MemoryModel> memory;
};

// The cuts of options.partition: cuts[0] = 0 < … < cuts[S] = layers; stage s runs layers
// [cuts[s], cuts[s+1]). "auto" minimizes the predicted step time of the slowest replica under the
// memory limits (see the file comment); throws ConfigError when the partition string is invalid
// or no cut fits the memory.
std::vector<int> stageCuts(const CutRequest& request);

// Seconds of one micro-batch of `micro_batch` samples through layers [first, last) — forward,
// backward, and the checkpointed backward's extra forward — on request.reference in fp32, as
// plan::CostModel::microBatchSeconds prices it for the model of request.profile (each layer's
// parameters and forward FLOPs, its fp32 output bytes as what it streams); transfers are left
// out. A device of speed s takes this / s. The automatic cut prices each stage so, at the
// micro-batch of the slowest replica there. ConfigError when the layers are not in the profile
// or micro_batch < 0.
double stageSeconds(const CutRequest& request, int first, int last, double micro_batch);

// What the memory model is asked for stage `stage` of layers [first, last) of a model of `layers`
// layers under `options`: fp32,
// micro-batches of `micro_batch` samples, as many in flight as the schedule holds there, the
// job's checkpointing mode, as the pipeline trainer runs a stage (plan::trainerStageRequest).
plan::StageMemoryRequest stageMemoryRequest(const PipelineOptions& options, int layers, int stage,
                                            int first, int last, std::int64_t micro_batch);

}  // namespace chorus::parallel
