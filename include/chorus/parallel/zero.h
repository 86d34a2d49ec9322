// ZeRO stages 1 to 3 (Rajbhandari et al. 2020) with shards of unequal size: rank r owns one
// contiguous slice [bounds[r], bounds[r+1]) of the flattened parameters, sized by the plan (by
// each rank's memory, parallel of its batch share, which the balancer sets by speed).
//
// The flat order is the gradient reducer's launch order (its buckets, each parameter whole), so
// that each bucket is one contiguous range of it and stage 2 can reduce-scatter bucket by bucket
// (GradientReducer, ReducerOptions::scatter). In stages 1 and 2 every rank keeps the whole
// model's parameters; the optimizer holds the state of this rank's slice only, an fp32 master
// copy of the slice is the one it steps, and an all-gather of uneven slices rebuilds the
// parameters after each step. In stage 3 the master slice is all this rank keeps of the
// parameters: ZeroLayers (zero_layers.h) gathers each layer from every rank's slice when it runs,
// and the step gathers nothing.
//
// Redundancy (zero.redundancy = 1, for elastic recovery): rank r also keeps a replica of its
// successor's slice, rank (r + 1) mod n — the master copy and the optimizer state — and steps it
// with that slice's averaged gradient (taken from the whole gradient in stage 1, received from
// the successor in stages 2 and 3), so the replica stays equal to the owner's slice, bit for bit
// on one kind of device. A lost rank's slice then survives on its predecessor.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "chorus/comm/communicator.h"

namespace chorus::parallel {

// Bounds of `ranks` slices of `elements` in proportion to `fractions` (one per rank, >= 0, not all
// zero), by largest remainder so they sum exactly: size ranks + 1, bounds[0] = 0, bounds[ranks] =
// elements. Throws ConfigError on bad fractions.
std::vector<std::int64_t> shardBounds(std::int64_t elements, const std::vector<double>& fractions);

// The parameters' flat order: indices into the parameter list, bucket after bucket.
std::vector<int> flatOrder(const std::vector<std::vector<int>>& bucket_layout);

// The optimizer of one rank's slice, and the all-gather that rebuilds the parameters. Owns the
// slice's master copy and its optimizer; shares the parameters (the model's) and the
// communicator. Used by the training thread only; non-copyable.
class ZeroOptimizer {
 public:
  using MakeOptimizer =
      std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

  // `bounds` as shardBounds gives them, over the flattened `parameters` in `order` (fp32, all of
  // them); `make` builds the optimizer over the one slice tensor (and one more over the replica);
  // it may return null when the caller steps masterSlice() with an optimizer of its own (the
  // Python front's torch.optim): step(), stepSlices(), optimizer() and the state functions are
  // then not to be called.
  // `redundant`: keep a replica of the successor's slice (none in a world of one). Not collective.
  ZeroOptimizer(int stage, std::vector<at::Tensor> parameters, std::vector<int> order,
                std::vector<std::int64_t> bounds, std::shared_ptr<comm::Communicator> communicator,
                const MakeOptimizer& make, bool redundant = false);
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  int stage() const { return stage_; }
  // This rank, whose slice is [begin(), end()).
  int rank() const { return rank_; }
  const std::vector<std::int64_t>& bounds() const { return bounds_; }
  // The flat order: parameter indices, as flatOrder gave them.
  const std::vector<int>& order() const { return order_; }
  std::int64_t begin() const { return own_.begin; }
  std::int64_t end() const { return own_.end; }
  // Whether this rank keeps a replica of its successor's slice.
  bool redundant() const { return replica_ != nullptr; }
  // The rank whose slice the replica is, and its bounds (redundant() only).
  int successor() const { return (rank_ + 1) % static_cast<int>(bounds_.size() - 1); }
  std::int64_t replicaBegin() const { return replica_->begin; }
  std::int64_t replicaEnd() const { return replica_->end; }
  // The slice's gradient: stage 2's reducer writes the averaged gradient of the slice here.
  at::Tensor gradientSlice() const { return own_.gradient; }
  // Stage 1: copies this rank's slice of the parameters' averaged .grad into gradientSlice()
  // (and the successor's into the replica's gradient).
  void takeGradientSlice();
  // Stages 2 and 3 with a replica, collective: each rank sends its slice's averaged gradient to
  // its predecessor and receives its successor's (one all-to-all).
  void exchangeReplicaGradients();
  // The optimizer's step on the slice (and the replica), then (stages 1 and 2) the collective
  // all-gather of every rank's slice into the parameters. Every rank calls it, or none (a
  // skipped step).
  void step();
  // The two halves of step(): the local optimizer steps, and the collective all-gather (nothing
  // in stage 3).
  void stepSlices();
  void gatherParameters();
  // The master slice the optimizer steps (fp32, end() - begin() elements): stage 3's shard of
  // the parameters. Shares its storage.
  at::Tensor masterSlice() const { return own_.master.detach(); }
  // The replica's master slice (replicaEnd() - replicaBegin() elements; redundant() only).
  at::Tensor replicaMasterSlice() const { return replica_->master.detach(); }
  // Collective: every rank's slice, all-gathered, as one flat fp32 tensor in order() (stage 3's
  // whole parameters, for a test or an export; the caller holds the whole model while it lives).
  at::Tensor gatherWhole() const;
  // Sets the parameters' gradients to none (the slice's is overwritten every step).
  void clearGradients();
  // Copies this rank's slice of the parameters into the master copy the optimizer steps: after
  // the parameters were set from elsewhere (a checkpoint), or the next step would undo that.
  // Stages 1 and 2 (stage 3's parameters hold no values between steps).
  void loadMasterFromParameters();
  // Copies this rank's slice of the parameters into the master copy, taking parameter `index`'s
  // values (any shape, its number of elements) from `value_of(index)`, which is called only for
  // the parameters that overlap the slice, in order(): stage 3's resume, from a model file read
  // one parameter at a time or from parameters put together elsewhere.
  void loadMaster(const std::function<at::Tensor(int index)>& value_of);
  torch::optim::Optimizer& optimizer() { return *own_.optimizer; }
  const torch::optim::Optimizer& optimizer() const { return *own_.optimizer; }
  // The replica's optimizer (redundant() only): its learning rate follows the slice's.
  torch::optim::Optimizer& replicaOptimizer() { return *replica_->optimizer; }

  // The optimizer state of the slice as flat tensors of its length by name ("momentum_buffer";
  // "exp_avg", "exp_avg_sq"), plus "step" (one element) for AdamW; empty before the first step.
  std::map<std::string, at::Tensor> sliceState() const;
  // The same of the replica (redundant() only).
  std::map<std::string, at::Tensor> replicaState() const;
  // The state of [begin(), end()) (and of the replica's range) cut from whole flat states (every
  // name as sliceState gives it, over all the flattened parameters), e.g. assembled from another
  // shard layout.
  void loadWholeState(const std::map<std::string, at::Tensor>& whole);
  // The same from this rank's slice of each state (end() - begin() elements; "step" as is): a
  // resume that read only the slice.
  void loadSliceState(const std::map<std::string, at::Tensor>& slices);
  // The same for the replica (replicaEnd() - replicaBegin() elements).
  void loadReplicaState(const std::map<std::string, at::Tensor>& slices);
  // Copies `slice` (end() - begin() elements) into the master slice: stage 3's resume.
  void loadMasterSlice(const at::Tensor& slice);
  // The same for the replica's master.
  void loadReplicaMasterSlice(const at::Tensor& slice);

 private:
  int stage_;
  std::vector<at::Tensor> parameters_;
  std::vector<int> order_;
  std::vector<std::int64_t> bounds_;
  std::shared_ptr<comm::Communicator> communicator_;
  // One range of the flat space this rank steps: its own slice, or the replica of its
  // successor's.
  struct Slice {
    std::int64_t begin = 0, end = 0;
    at::Tensor master;    // fp32 copy of the range, the optimizer's one parameter
    at::Tensor gradient;  // its gradient (master's .grad)
    std::unique_ptr<torch::optim::Optimizer> optimizer;
  };
  void initSlice(Slice& slice, std::int64_t begin, std::int64_t end, const MakeOptimizer& make);
  void loadMasterOf(Slice& slice, const std::function<at::Tensor(int index)>& value_of);
  void takeGradientOf(Slice& slice);
  std::map<std::string, at::Tensor> stateOf(const Slice& slice) const;
  void loadStateOf(Slice& slice, const std::map<std::string, at::Tensor>& slices);

  int rank_;
  Slice own_;
  std::unique_ptr<Slice> replica_;  // redundant only
};

}  // namespace chorus::parallel
