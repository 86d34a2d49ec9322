// Data-parallel gradient synchronization: bucketed all-reduce launched from autograd hooks while
// backward is still running, for ranks that each computed gradients on their own share of a global
// batch.
//
// Every rank back-propagates the SUM of its samples' losses (over as many micro-batches as it
// needs). The reducer all-reduces those sums and divides by the global batch B, so every rank ends
// with sum_i(per-sample gradients on rank i) / B: exactly the gradient of single-device training
// on the global batch (DESIGN.md, "A training step"), whatever the shares, up to floating-point
// reduction order.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "chorus/comm/communicator.h"
#include "chorus/comm/hierarchical_all_reduce.h"
#include "chorus/parallel/compression.h"

namespace chorus::parallel {

struct ReducerOptions {
  // Target bytes per bucket; a parameter larger than this gets a bucket of its own.
  // Default: 25 MiB (PyTorch DDP's bucket_cap_mb).
  std::int64_t bucket_bytes = 25ll << 20;
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
};

// What one synchronization cost, for the load balancer and metrics. Value type.
struct ReduceTiming {
  double wait_seconds = 0;  // time finish() blocked waiting for all-reduces
  int buckets = 0;
};

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
  // Completes the step's synchronization: launches buckets not launched yet (all of them when this
  // rank ran no backward, e.g. a zero share; missing gradients count as zeros), waits for all, and
  // writes the averaged gradient, sum / global_batch, into every parameter's .grad.
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

  // Whether the gradients the last finish() or finishLocal() wrote are all finite: one check per
  // bucket, whose flat buffer holds exactly what was written (cheaper than a check per parameter,
  // which costs a small model a quarter of a millisecond per step).
  bool gradientsFinite() const;

  int numBuckets() const;
  // Parameter indices per bucket, in launch order.
  std::vector<std::vector<int>> bucketLayout() const;

 private:
  struct Bucket;
  void onGradientReady(int parameter);
  void launchReadyBuckets();
  void launch(Bucket& bucket);
  void writeGradients(double scale);

  std::vector<at::Tensor> parameters_;
  std::shared_ptr<comm::Communicator> communicator_;
  ReducerOptions options_;
  // The engine of non-default reductions: options_.hierarchical or the private one for a codec
  // alone; null on the default path.
  std::shared_ptr<comm::HierarchicalAllReduce> engine_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<int> bucket_of_;  // parameter -> bucket
  int next_to_launch_ = 0;
  bool armed_ = false;
};

}  // namespace chorus::parallel
