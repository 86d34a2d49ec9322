// Layers and their optimizer state from rank to rank (layer_transfer.h).
#include "train/layer_transfer.h"

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include "chorus/core/error.h"
#include "chorus/parallel/storage_bytes.h"

namespace chorus::runtime {
namespace {

enum Kind : std::int64_t { kNone = 0, kSgd = 1, kAdamW = 2 };

// The kind makeOptimizer builds for `options`.
Kind kindOf(const OptimizerSection& options) { return options.name == "adamw" ? kAdamW : kSgd; }

std::vector<at::Tensor> trainable(model::ZooModel& model, const LayerTransfer& transfer) {
  std::vector<at::Tensor> parameters;
  for (int l = transfer.first; l < transfer.last; ++l)
    for (const at::Tensor& parameter : model.layerParameters(l))
      if (parameter.requires_grad()) parameters.push_back(parameter);
  return parameters;
}

// The state tensors of `state` in wire order (empty when there is none).
std::vector<at::Tensor> stateTensors(torch::optim::OptimizerParamState* state, Kind kind) {
  if (state == nullptr) return {};
  if (kind == kSgd) {
    const auto& sgd = static_cast<torch::optim::SGDParamState&>(*state);
    if (!sgd.momentum_buffer().defined()) return {};
    return {sgd.momentum_buffer()};
  }
  const auto& adamw = static_cast<torch::optim::AdamWParamState&>(*state);
  std::vector<at::Tensor> tensors{adamw.exp_avg(), adamw.exp_avg_sq()};
  if (adamw.max_exp_avg_sq().defined()) tensors.push_back(adamw.max_exp_avg_sq());
  return tensors;
}

torch::optim::OptimizerParamState* stateOf(torch::optim::Optimizer& optimizer,
                                           const at::Tensor& parameter) {
  auto& states = optimizer.state();
  const auto found = states.find(parameter.unsafeGetTensorImpl());
  return found == states.end() ? nullptr : found->second.get();
}

comm::OpOptions optionsOf(const LayerTransferContext& c, int tag) {
  comm::OpOptions options;
  options.timeout = c.timeout;
  options.tag = tag;
  return options;
}

void send(const LayerTransferContext& c, const LayerTransfer& transfer, int tag,
          std::vector<comm::Work>& works, std::vector<at::Tensor>& keep) {
  torch::NoGradGuard no_grad;
  const std::vector<at::Tensor> parameters = trainable(c.model, transfer);
  if (parameters.empty()) return;  // nothing to carry (the receiver knows it too)
  CHORUS_CHECK_CONFIG(c.optimizer != nullptr, "layers ", transfer.first, "..", transfer.last,
                      " are sent by a rank without an optimizer");
  const Kind kind = kindOf(c.options);
  const bool adamw = kind == kAdamW;
  CHORUS_CHECK_CONFIG(adamw ? dynamic_cast<torch::optim::AdamW*>(c.optimizer) != nullptr
                            : dynamic_cast<torch::optim::SGD*>(c.optimizer) != nullptr,
                      "layers carry the state of SGD or AdamW only");
  std::vector<std::int64_t> header{kind};
  std::vector<at::Tensor> flat;
  for (at::Tensor parameter : parameters) {
    torch::optim::OptimizerParamState* state = stateOf(*c.optimizer, parameter);
    const std::vector<at::Tensor> tensors = stateTensors(state, kind);
    const bool has_step = adamw && !tensors.empty();
    header.push_back(tensors.empty() ? 0 : 1);
    header.push_back(has_step ? static_cast<torch::optim::AdamWParamState*>(state)->step() : 0);
    header.push_back(has_step && tensors.size() == 3 ? 1 : 0);
    flat.push_back(parameter.detach().reshape({-1}));
    for (const at::Tensor& tensor : tensors) flat.push_back(tensor.detach().reshape({-1}));
    parameter.mutable_grad() = at::Tensor();
  }
  keep.push_back(at::tensor(header, at::kLong));
  keep.push_back(at::cat(flat).contiguous());
  works.push_back(c.world.send(keep[keep.size() - 2], transfer.to, optionsOf(c, tag)));
  works.push_back(c.world.send(keep.back(), transfer.to, optionsOf(c, tag + 1)));
}

void receive(const LayerTransferContext& c, const LayerTransfer& transfer, int tag,
             ReceivedStates& received) {
  torch::NoGradGuard no_grad;
  const Kind kind = kindOf(c.options);
  const std::vector<at::Tensor> parameters = trainable(c.model, transfer);
  if (parameters.empty()) return;
  at::Tensor header = at::empty({1 + 3 * static_cast<std::int64_t>(parameters.size())}, at::kLong);
  c.world.recv(header, transfer.from, optionsOf(c, tag)).wait();
  const auto h = header.accessor<std::int64_t, 1>();
  CHORUS_CHECK_CONFIG(h[0] == kind, "rank ", transfer.from, " sent optimizer state of kind ", h[0],
                      ", this rank's is ", static_cast<std::int64_t>(kind));
  std::int64_t elements = 0;
  std::vector<int> counts;  // state tensors per parameter
  for (std::size_t p = 0; p < parameters.size(); ++p) {
    const int count = h[1 + 3 * p] == 0 ? 0 : kind == kSgd ? 1 : 2 + (h[3 + 3 * p] ? 1 : 0);
    counts.push_back(count);
    elements += parameters[p].numel() * (1 + count);
  }
  at::Tensor flat = at::empty({elements}, parameters.front().options().requires_grad(false));
  c.world.recv(flat, transfer.from, optionsOf(c, tag + 1)).wait();
  std::int64_t offset = 0;
  const auto next = [&](const at::Tensor& like) {
    at::Tensor part = flat.narrow(0, offset, like.numel()).view_as(like).clone();
    offset += like.numel();
    return part;
  };
  for (std::size_t p = 0; p < parameters.size(); ++p) {
    at::Tensor parameter = parameters[p];
    // A layer of another stage until now: this rank held its shape only.
    if (parallel::storageBytesDropped(parameter)) parallel::allocateStorageBytes(parameter);
    parameter.copy_(next(parameter));
    const void* key = parameter.unsafeGetTensorImpl();
    if (counts[p] == 0) continue;
    if (kind == kSgd) {
      auto state = std::make_unique<torch::optim::SGDParamState>();
      state->momentum_buffer(next(parameter));
      received[key] = std::move(state);
    } else {
      auto state = std::make_unique<torch::optim::AdamWParamState>();
      state->step(h[2 + 3 * p]);
      state->exp_avg(next(parameter));
      state->exp_avg_sq(next(parameter));
      if (counts[p] == 3) state->max_exp_avg_sq(next(parameter));
      received[key] = std::move(state);
    }
  }
}

}  // namespace

ReceivedStates transferLayers(const LayerTransferContext& context,
                              const std::vector<LayerTransfer>& transfers) {
  const int me = context.world.rank();
  std::vector<comm::Work> works;
  std::vector<at::Tensor> keep;  // alive until the sends finished
  for (std::size_t t = 0; t < transfers.size(); ++t)
    if (transfers[t].from == me)
      send(context, transfers[t], context.tag_base + 2 * static_cast<int>(t), works, keep);
  ReceivedStates received;
  for (std::size_t t = 0; t < transfers.size(); ++t)
    if (transfers[t].to == me)
      receive(context, transfers[t], context.tag_base + 2 * static_cast<int>(t), received);
  for (comm::Work& work : works) work.wait();
  return received;
}

}  // namespace chorus::runtime
