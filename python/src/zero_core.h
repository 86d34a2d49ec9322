// ZeRO for the Python front (chorus.DataParallel(..., zero=1|2|3)): the C++ ZeRO of `chorus
// train`'s [zero] (parallel/zero.h, zero_layers.h) on a Python module's parameters, stepped by
// the user's own torch.optim optimizer instead of a C++ one.
//
// Rank r owns one contiguous slice [bounds[r], bounds[r+1]) of the parameters flattened in the
// gradient reducer's launch order, sized by `shards`: "even", a list of fractions, or "memory"
// (each rank's device budget after its replicated state, plan::zeroShardsByMemory, as [zero]
// sizes them for `chorus train`). The slice's fp32 master copy and its gradient live in the
// ZeroOptimizer; the Python side (python/chorus/zero.py) points the user's optimizer at views of
// them (pieces(): one view per parameter that overlaps the slice), so the optimizer's state exists
// for the slice only. Per step:
//   stage 1: the reducer all-reduces; takeGradients() copies the slice of the averaged .grad;
//   stage 2: the reducer reduce-scatters each bucket straight into the slice's gradient;
//   stage 3: as 2, and the parameters hold no bytes between steps: gather() all-gathers the whole
//            module from the slices before the step's first forward, release() drops it after
//            the reduction (ZeroLayers over one layer: the whole module);
// then the optimizer steps the slice, and gatherParameters() all-gathers the slices back into the
// parameters (stages 1 and 2). Training thread only; non-copyable.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chorus/parallel/gradient_reducer.h"
#include "chorus/parallel/zero.h"
#include "chorus/parallel/zero_layers.h"
#include "chorus/runtime/launch/worker.h"

namespace chorus::python {

struct ZeroOptions {
  // 0 (off), 1 (optimizer state), 2 (and gradients) or 3 (and parameters). Default: 0.
  int stage = 0;
  // "memory", "even" or "list" (then `fractions`: one per rank, each in [0, 1], summing to 1).
  // Default: "memory" (an even split when no device has a memory budget, as [zero]).
  std::string shards = "memory";
  std::vector<double> fractions;
};

// Throws ConfigError unless `options` is a valid ZeRO configuration for `world` ranks.
void checkZeroOptions(const ZeroOptions& options, int world);

// One parameter's part of this rank's slice: elements [offset, offset + count) of parameter
// `parameter` (flattened) are elements [at, at + count) of the slice. Value type.
struct SlicePiece {
  int parameter = 0;
  std::int64_t offset = 0;
  std::int64_t at = 0;
  std::int64_t count = 0;
};

class ZeroCore {
 public:
  // Sizes the slices (collective for "memory": every rank's budget is all-gathered) over the flat
  // order of a reducer with `reducing`'s buckets, and, for stage 2 and up, sets `reducing` to
  // reduce-scatter into the slice's gradient. The master slice is copied from `parameters` by
  // start(), after the caller has made them equal on every rank. Throws ConfigError on bad
  // options or parameters that are not contiguous fp32.
  ZeroCore(runtime::Worker& worker, std::vector<at::Tensor> parameters, const ZeroOptions& options,
           parallel::ReducerOptions& reducing);
  ~ZeroCore();
  ZeroCore(const ZeroCore&) = delete;
  ZeroCore& operator=(const ZeroCore&) = delete;

  // Takes the master slice from the parameters; stage 3 then drops their bytes.
  void start();
  int stage() const { return options_.stage; }
  // Each rank's fraction of the flat space (what the slices were sized by).
  const std::vector<double>& fractions() const { return fractions_; }
  const std::vector<std::int64_t>& bounds() const { return zero_->bounds(); }
  const std::vector<int>& order() const { return zero_->order(); }
  std::vector<SlicePiece> pieces() const;
  // The slice's fp32 master copy and its averaged gradient (views share their storage).
  at::Tensor masterSlice() const { return zero_->masterSlice(); }
  at::Tensor gradientSlice() const { return zero_->gradientSlice(); }

  // Stage 3, collective: gives the parameters their bytes and all-gathers them from the slices
  // (nothing when they have them); release() drops them again. No-ops in stages 1 and 2.
  void gather();
  void release();
  bool gathered() const { return gathered_; }
  // After the reduction: stage 1 copies the slice of the averaged .grad; every stage frees the
  // parameters' .grad (the slice's gradient is what the optimizer reads).
  void takeGradients();
  // Collective, after the optimizer stepped the slice: stages 1 and 2 all-gather every rank's
  // slice into the parameters (stage 3 gathers at the next forward).
  void gatherParameters();
  // After the parameters were set from elsewhere (a checkpoint): their slice into the master
  // copy. Stage 3: REQUIRES gathered().
  void loadMasterFromParameters();

 private:
  std::vector<double> shardFractions(runtime::Worker& worker, int world) const;

  ZeroOptions options_;
  std::vector<at::Tensor> parameters_;
  std::shared_ptr<comm::Communicator> world_;
  std::vector<double> fractions_;
  std::unique_ptr<parallel::ZeroOptimizer> zero_;
  std::unique_ptr<parallel::ZeroLayers> layers_;  // stage 3
  bool gathered_ = true;  // the parameters hold their values (stage 3: between gather and release)
};

}  // namespace chorus::python
