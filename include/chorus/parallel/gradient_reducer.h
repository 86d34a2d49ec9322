// Data-parallel gradient synchronization: bucketed all-reduce launched from autograd hooks while
// backward is still running, for ranks that each computed gradients on their own share of a global
// batch.
//
// Every rank back-propagates the SUM of its samples' losses (over as many micro-batches as it
// needs). The reducer all-reduces those sums and divides by the global batch B, so every rank ends
// with sum_i(per-sample gradients on rank i) / B: exactly the gradient of single-device training
// on the global batch (docs/architecture.md, "A training step"), whatever the shares, up to
// floating-point reduction order.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "chorus/comm/communicator.h"
#include "chorus/comm/hierarchical_all_reduce.h"
#include "chorus/parallel/compression.h"

namespace chorus::parallel {

// Bucket sizes. Parameters go into buckets in reverse registration order (the order backward
// produces their gradients); a bucket closes when the next parameter would take it past its cap,
// and a parameter larger than the cap gets a bucket of its own. The cap of bucket k is
//   min(bucket_bytes, max(min_bucket_bytes, total gradient bytes / min_buckets)),
// and of the first bucket, k = 0, at most first_bucket_bytes. The first and the last terms are
// PyTorch DDP's rule: a small first bucket, so that communication starts early in backward, then
// bucket_cap_mb (a bucket_bytes below first_bucket_bytes caps the first bucket too). The third
// makes every model get several buckets (if its parameters allow): with DDP's sizes alone every
// model of chorus's zoo (0.2-4 MB of gradients) fits one or two buckets, launched when backward is
// all but over, and nothing overlaps. The floor keeps buckets of tiny models from costing more in
// per-collective latency than they hide.
struct ReducerOptions {
  // A world of one sends nothing and keeps its gradients in place (alone()). Off for an elastic
  // job: a lone survivor learns of a joining worker when an abort fails its collectives, so it
  // keeps running them. Default: true.
  bool skip_alone = true;
  // Cap of the first bucket to be launched. Default: 1 MiB (PyTorch DDP's first bucket).
  std::int64_t first_bucket_bytes = 1ll << 20;
  // Cap of every later bucket. Default: 25 MiB (PyTorch DDP's bucket_cap_mb).
  std::int64_t bucket_bytes = 25ll << 20;
  // Every bucket is capped at the total gradient bytes / min_buckets, but not below
  // min_bucket_bytes. REQUIRES: min_buckets >= 1 (1: DDP's rule alone), min_bucket_bytes >= 1.
  // Default: 4 buckets, 32 KiB.
  int min_buckets = 4;
  std::int64_t min_bucket_bytes = 32ll << 10;
  // Launch a bucket's all-reduce from the autograd hook as soon as its gradients are final,
  // overlapping communication with the rest of backward. Default: true. False launches every
  // bucket after backward (for measurements of the overlap's value).
  bool overlap = true;
  // Runs each bucket's all-reduce through this hierarchical all-reduce, which must span the same
  // ranks as the reducer's communicator (and is then used by no one else during a step).
  // Default: null, the plain all-reduce on the communicator (bit-identical to a reducer without
  // these options).
  std::shared_ptr<comm::HierarchicalAllReduce> hierarchical;
  // Compresses each bucket where the data crosses groups: among the leaders of `hierarchical`
  // (the slow link), or among all ranks without it (the reducer then builds a private
  // HierarchicalAllReduce over one-rank groups, collectively, in its constructor). Shared so the
  // trainer can checkpoint its state(). Default: null, no compression.
  std::shared_ptr<GradientCodec> codec;
  // Called on the training thread when a bucket's gradients are final and copied into it, with
  // the bucket's index, once per bucket per synchronizing step, in launch order, from an autograd
  // hook during backward or from finish(). Returns whether to hold the bucket back: a held bucket
  // is launched by launchNextHeld() (or finish()), so the buckets still go out in launch order.
  // Why: a trainer that emulates a slower device notes how far its compute had got and launches
  // the bucket when the emulated device would have got there (device/speed_emulator.h); the
  // reducer knows nothing of emulation. Not called by averageParameters(). Default: empty,
  // nothing is held.
  std::function<bool(int bucket)> hold_launch;
  // ZeRO stage 2 (parallel/zero.h): when not empty, each rank's slice of the flattened gradients
  // in launch order (size ranks + 1, as shardBounds gives them). Each bucket is then
  // reduce-scattered instead of all-reduced, the parameters' .grad are freed once copied into
  // their bucket, and finish() writes this rank's averaged slice into `scatter_output` (fp32,
  // the slice's length) and no .grad. Excludes `hierarchical` and `codec`, and local SGD.
  // Default: empty, all-reduce.
  std::vector<std::int64_t> scatter_bounds;
  at::Tensor scatter_output;
  // Keep the buckets on the parameters' device (device-resident reduction: a CUDA rank's
  // all-reduce goes through NCCL, ordered after its gradients by the CUDA stream). Only where the
  // communication can carry device tensors: a world that one backend spans
  // (comm::Topology::native()), or `hierarchical`, which bridges groups of different devices
  // through host memory. Default: false: the buckets live in host memory, each rank copies its
  // gradients there and the all-reduce runs over shm or Gloo, whatever the devices. Under a
  // scatter the buckets live where scatter_output does, whatever this says.
  bool device_buckets = false;
};

// When one bucket's all-reduce of the last synchronizing step ran, for a trace. Value type.
struct BucketTiming {
  int bucket = 0;
  std::chrono::steady_clock::time_point launched;
  // When the reducer first saw it complete (it looks at every hook, every held launch and in
  // finish()): the all-reduce ended at this moment or before.
  std::chrono::steady_clock::time_point completed;
};

// What one synchronization cost, for the load balancer and metrics. Value type.
struct ReduceTiming {
  double wait_seconds = 0;  // time finish() blocked waiting for all-reduces
  int buckets = 0;
};

// The buckets a reducer with `options` makes of `parameters`: parameter indices per bucket, in
// launch order (what GradientReducer::bucketLayout() returns). Throws ConfigError on bad sizes.
std::vector<std::vector<int>> bucketLayoutOf(const std::vector<at::Tensor>& parameters,
                                             const ReducerOptions& options);

// Owns the buckets and the hooks on `parameters` (removed on destruction). Used by the training
// thread only: hooks fire on the thread that runs backward (for CPU tensors, the caller's), and
// buckets are launched in one fixed order on every rank (bucket k only after buckets < k), so all
// ranks issue the same collectives in the same order even if their gradients become ready in a
// different order. With a hierarchical all-reduce or a codec, a bucket's multi-phase reduction
// runs on the engine's helper thread, in launch order, and finish() waits for it; the codec is
// touched only there during a step. Non-copyable.
class GradientReducer {
 public:
  GradientReducer(std::vector<at::Tensor> parameters,
                  std::shared_ptr<comm::Communicator> communicator, ReducerOptions options = {});
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Arms the hooks for the next backward pass: call it before the LAST micro-batch's backward of a
  // step (earlier micro-batches only accumulate into .grad).
  void armForFinalBackward();
  // Launches the oldest bucket held back by ReducerOptions::hold_launch; false when none is.
  bool launchNextHeld();
  // Buckets held back and not launched yet.
  int heldBuckets() const;
  // Completes the step's synchronization: launches buckets not launched yet (held ones first) (all
  // of them when this rank ran no backward, e.g. a zero share; missing gradients count as zeros),
  // waits for all, and writes the averaged gradient, sum / global_batch, into every parameter's
  // .grad.
  ReduceTiming finish(std::int64_t global_batch);

  // Local SGD (Lin et al. 2020, "Don't use large mini-batches, use local SGD"): on steps that do
  // not synchronize, finishLocal() writes this rank's own average gradient, sum / local_batch
  // (zero when local_batch is 0), without communicating. Every `period` steps the trainer then
  // calls averageParameters() after its optimizer step.
  void finishLocal(std::int64_t local_batch);
  // Collective and blocking: every parameter becomes sum_r(weight_r * p_r) / sum_r(weight_r),
  // e.g. weight = samples this rank processed since the last average (uneven shares). A plain
  // fp32 all-reduce on the communicator, bucket by bucket. REQUIRES: no step in progress.
  void averageParameters(double weight = 1.0);

  // Whether the gradients the last finish() or finishLocal() wrote are all finite: one fused pass
  // over the buckets, whose flat buffers hold exactly what was written, and one read (a check per
  // parameter costs a small model a quarter of a millisecond per step); in a world of one the flag
  // finish() noted while it scaled the gradients in place; under scatter_bounds, one check of
  // this rank's slice.
  bool gradientsFinite() const;

  // The buckets' launch and completion times of the last finish(), in launch order.
  std::vector<BucketTiming> lastTimings() const { return timings_; }

  int numBuckets() const;
  // Parameter indices per bucket, in launch order.
  std::vector<std::vector<int>> bucketLayout() const;
  // Where the buckets live: the host, the parameters' device (ReducerOptions::device_buckets) or
  // scatter_output's.
  at::Device bucketDevice() const { return bucket_device_; }

 private:
  struct Bucket;
  void onGradientReady(int parameter);
  void launchReadyBuckets();
  // Copies the bucket's gradients into it, then holds it back or launches it.
  void release(Bucket& bucket);
  void launch(Bucket& bucket);
  void launchScatter(Bucket& bucket);
  // Throws ConfigError unless the scatter options fit `elements` gradient elements.
  void checkScatter(std::int64_t elements) const;
  bool scattering() const { return !options_.scatter_bounds.empty(); }
  // A world of one without a scatter: buckets are never sent (launch() completes them at once).
  bool alone() const { return options_.skip_alone && communicator_->size() == 1 && !scattering(); }
  // alone(): every gradient times `scale`, in place, noting a non-finite value in found_inf_.
  void scaleInPlace(double scale);
  // Where the buckets live (ReducerOptions::device_buckets); throws ConfigError when the
  // parameters are on several devices.
  at::Device chooseBucketDevice() const;
  void writeGradients(double scale);
  at::Tensor newBucket(std::int64_t elements) const;
  // Stamps the completion time of launched buckets that are done now.
  void noteCompletions();

  std::vector<at::Tensor> parameters_;
  std::shared_ptr<comm::Communicator> communicator_;
  ReducerOptions options_;
  // The engine of non-default reductions: options_.hierarchical or the private one for a codec
  // alone; null on the default path.
  std::shared_ptr<comm::HierarchicalAllReduce> engine_;
  at::Device bucket_device_{at::kCPU};
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<int> bucket_of_;  // parameter -> bucket
  int next_to_launch_ = 0;      // the next bucket to release
  // Released buckets held back (ReducerOptions::hold_launch), oldest first.
  std::deque<int> held_;
  std::vector<BucketTiming> timings_;
  bool armed_ = false;
  // A world of one: whether the last finish()'s gradients held a non-finite value (one element,
  // non-zero when so); undefined before the first.
  at::Tensor found_inf_;
};

}  // namespace chorus::parallel
