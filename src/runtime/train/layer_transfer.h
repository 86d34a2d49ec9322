// Private to runtime: layers sent from the rank that trained them to a rank that takes them, with
// their optimizer state — a move of a pipeline's cut (pipeline_recut.h) and the elastic recovery
// of a pipeline from a replica's stages (pipeline_regroup.h) both do it.
//
// Wire format, per run of consecutive layers: a header of int64 — the optimizer's kind (0 none,
// 1 SGD, 2 AdamW), then per trainable parameter whether it has state, its AdamW step and whether
// it has max_exp_avg_sq — then one flat tensor of the parameters' values followed by their state
// tensors, parameter by parameter. The receiver knows the parameters' shapes: every rank builds
// the whole model (and holds the values of its stage's layers only).
#pragma once

#include <torch/optim/optimizer.h>

#include <chrono>
#include <map>
#include <memory>
#include <vector>

#include "chorus/comm/communicator.h"
#include "chorus/model/zoo_model.h"
#include "chorus/runtime/job/job_config.h"

namespace chorus::runtime {

// The optimizer state of each parameter a rank received, by its TensorImpl (the optimizer's key).
using ReceivedStates = std::map<const void*, std::unique_ptr<torch::optim::OptimizerParamState>>;

// Layers [first, last) go from rank `from` to rank `to` of the communicator. Value type.
struct LayerTransfer {
  int first = 0;
  int last = 0;
  int from = 0;
  int to = 0;
};

// Where the layers travel and under which rules. Value type; the references must outlive the call.
struct LayerTransferContext {
  comm::Communicator& world;
  model::ZooModel& model;
  // The sender's optimizer, which holds the state of the layers it sends (SGD or AdamW, as
  // `options` names: ConfigError otherwise). Null on a rank that sends nothing.
  torch::optim::Optimizer* optimizer = nullptr;
  const OptimizerSection& options;
  std::chrono::milliseconds timeout;
  // The transfers' tags start here (two per transfer), above any a step uses.
  int tag_base = 1 << 24;
};

// Sends the transfers whose `from` is this rank and receives those whose `to` is: the layers'
// trainable parameters only (buffers and frozen parameters stay as the receiver has them; no zoo
// model has any). Values are copied into the model's parameters in place, storage given back
// first where it was dropped; returns the received optimizer states. A sent parameter's gradient is
// cleared (it trains elsewhere from now on). Collective over the ranks the transfers name, which
// must all pass the same list; blocks with `timeout` (TimeoutError), throws CommError when a peer
// is lost.
ReceivedStates transferLayers(const LayerTransferContext& context,
                              const std::vector<LayerTransfer>& transfers);

}  // namespace chorus::runtime
