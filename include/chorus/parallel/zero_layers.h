// ZeRO stage 3 (Rajbhandari et al. 2020): the parameters are sharded at rest. Each rank keeps
// only its slice of the flattened parameters (the ZeroOptimizer's fp32 master slice, sized by
// the plan's shards); a layer's full weights exist only while the layer runs. Before a layer's
// forward and again before its backward, every rank's piece of that layer is all-gathered
// (uneven) into one flat buffer that the layer's parameters view; the buffer is freed after the
// forward and after the layer's gradients are computed. The next layer's gather is issued before
// the current one computes (the previous one's in backward), so the transfer overlaps compute:
// at most two layers are gathered at a time, plus the last layer, which stays gathered from its
// forward through its backward. Gradients are reduce-scattered bucket by bucket as in stage 2
// (GradientReducer's scatter options); they never pass through this class.
//
// Freeing keeps each buffer's storage object and drops its bytes (nbytes 0), and gathering
// allocates them again through the storage's own allocator (a memory budget's too): the
// parameters, their views and the tensors autograd saved of them in forward all share that
// storage, so they read the regathered weights in backward (FSDP frees its flat parameters the
// same way). Only the zoo's layers decide what is gathered together: a layer's parameters must
// be one contiguous range of the flat order, which the reducer's reverse-registration order gives.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "chorus/comm/communicator.h"
#include "chorus/comm/work.h"

namespace chorus::model {
class ZooModel;
}

namespace chorus::parallel {

// The layers of one rank's ZeRO-3 model. Shares the model's parameters (their storage becomes its
// buffers') and `shard` (the optimizer's master slice, read at every gather); owns the buffers and
// the gradient hooks on the parameters (removed on destruction). `communicator` carries the gathers
// only: gathers are issued from autograd hooks, so they need a group of their own, apart from the
// reducer's buckets, which a rank emulating a slower device launches later. Used by the training
// thread only (CPU backward runs its hooks there); non-copyable.
class ZeroLayers {
 public:
  // `layers`: the parameter indices (into `parameters`) of each layer of `model`, in layer order;
  // `order` and `bounds` as for ZeroOptimizer; `shard` fp32 of bounds[r + 1] - bounds[r]
  // elements. Frees the parameters' current storage. Throws ConfigError when a layer's parameters
  // are not one contiguous range of the flat order. Not collective.
  ZeroLayers(std::vector<at::Tensor> parameters, const std::vector<std::vector<int>>& layers,
             const std::vector<int>& order, std::vector<std::int64_t> bounds, at::Tensor shard,
             std::shared_ptr<comm::Communicator> communicator);
  ~ZeroLayers();
  ZeroLayers(const ZeroLayers&) = delete;
  ZeroLayers& operator=(const ZeroLayers&) = delete;

  // model.forward(x), layer by layer, each gathered before it runs and freed after it (the last
  // one is kept when autograd records, for the backward that follows). Collective: every rank
  // calls it with its share, possibly empty, as often as the others.
  at::Tensor forward(model::ZooModel& model, at::Tensor x);
  // Gathers every layer and waits for all: for a caller that runs the layers itself (the Python
  // front's stage 3 gathers its whole module, one layer, before a step's first forward). Collective
  // as forward() is; release() frees them.
  void gatherAll();
  // Frees every layer still gathered (a layer none of whose gradients backward reached, the
  // last one after a forward without backward) and waits for gathers in flight. Call it after
  // each backward and after an evaluation.
  void release();

  // Called around each wait for a gather that had not completed when its layer was needed: a
  // rank waiting for its peers is not computing, and a load balancer that saw the wait as compute
  // would take a fast rank for a slow one (the trainer pauses its compute phase here). Default:
  // none.
  struct WaitHooks {
    std::function<void()> begin;
    std::function<void()> end;
  };
  void setWaitHooks(WaitHooks hooks) { wait_hooks_ = std::move(hooks); }

  std::int64_t layerCount() const;
  // Elements of the widest layer: what one gathered buffer holds at most.
  std::int64_t widestLayer() const;
  // Layers whose full weights are allocated now (tests: the at-rest state is zero).
  int gatheredLayers() const;

 private:
  struct Layer;
  // Issues the gather of `layer` unless it is gathered or in flight.
  void startGather(int layer);
  // Gathers `layer` if needed and waits for it.
  void awaitGather(int layer);
  void free(int layer);
  // Backward reached layer `layer`'s output: its weights are needed now, the one below next.
  void onOutputGradient(int layer);
  // One of the layer's parameters got its gradient: free the layer after the last.
  void onParameterGradient(int layer);

  std::vector<Layer> layers_;
  std::vector<std::int64_t> bounds_;
  at::Tensor shard_;
  std::shared_ptr<comm::Communicator> communicator_;
  std::vector<at::Tensor> hooked_;  // parameters carrying a hook of this object
  std::vector<unsigned> hook_handles_;
  bool recording_ = false;  // forward ran under autograd; its backward has not finished
  WaitHooks wait_hooks_;
};

}  // namespace chorus::parallel
