#include "chorus/parallel/zero_layers.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <algorithm>
#include <map>

#include "chorus/core/error.h"
#include "chorus/model/zoo_model.h"
#include "chorus/parallel/storage_bytes.h"

namespace chorus::parallel {

struct ZeroLayers::Layer {
  std::int64_t begin = 0, end = 0;   // the layer's range of the flat order
  at::Tensor buffer;                 // its full weights, flat; no bytes at rest
  std::vector<std::int64_t> counts;  // each rank's piece of the range
  at::Tensor piece;                  // this rank's piece: a view of the shard
  std::optional<comm::Work> work;    // the gather in flight
  bool gathered = false;             // the buffer has its bytes (filled once work is done)
  int trained = 0;                   // parameters that get a gradient
  int pending = 0;                   // of those, the ones backward has not reached yet
};

ZeroLayers::ZeroLayers(std::vector<at::Tensor> parameters,
                       const std::vector<std::vector<int>>& layers, const std::vector<int>& order,
                       std::vector<std::int64_t> bounds, at::Tensor shard,
                       std::shared_ptr<comm::Communicator> communicator)
    : bounds_(std::move(bounds)), shard_(shard.detach()), communicator_(std::move(communicator)) {
  const int rank = communicator_->rank();
  CHORUS_CHECK_CONFIG(static_cast<int>(bounds_.size()) == communicator_->size() + 1 &&
                          shard_.numel() == bounds_[rank + 1] - bounds_[rank] &&
                          shard_.scalar_type() == at::kFloat,
                      "ZeRO-3: the shard does not match the bounds of rank ", rank);
  std::vector<std::int64_t> offset(parameters.size(), 0);
  std::int64_t position = 0;
  for (int index : order) {
    offset.at(index) = position;
    position += parameters.at(index).numel();
  }
  layers_.resize(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    Layer& layer = layers_[l];
    layer.begin = position;
    layer.end = 0;
    std::int64_t elements = 0;
    for (int index : layers[l]) {
      layer.begin = std::min(layer.begin, offset[index]);
      layer.end = std::max(layer.end, offset[index] + parameters[index].numel());
      elements += parameters[index].numel();
    }
    if (layers[l].empty()) layer.begin = layer.end = 0;
    CHORUS_CHECK_CONFIG(layer.end - layer.begin == elements, "ZeRO-3: the parameters of layer ", l,
                        " are not one contiguous range of the flat order");
    for (int r = 0; r + 1 < static_cast<int>(bounds_.size()); ++r)
      layer.counts.push_back(std::max<std::int64_t>(
          0, std::min(layer.end, bounds_[r + 1]) - std::max(layer.begin, bounds_[r])));
    const std::int64_t from = std::max(layer.begin, bounds_[rank]);
    layer.piece =
        shard_.narrow(0, std::min(from - bounds_[rank], shard_.numel()), layer.counts[rank]);
    layer.buffer = at::empty({elements}, shard_.options());
    for (int index : layers[l]) {
      at::Tensor& parameter = parameters[index];
      CHORUS_CHECK_CONFIG(parameter.scalar_type() == at::kFloat,
                          "ZeRO-3: parameters must be fp32 (master weights)");
      parameter.set_data(layer.buffer.narrow(0, offset[index] - layer.begin, parameter.numel())
                             .view(parameter.sizes()));
      if (!parameter.requires_grad()) continue;
      ++layer.trained;
      const int at = static_cast<int>(l);
      hook_handles_.push_back(
          parameter.register_hook([this, at](const at::Tensor&) { onParameterGradient(at); }));
      hooked_.push_back(parameter);
    }
    dropStorageBytes(layer.buffer);
  }
}

ZeroLayers::~ZeroLayers() {
  for (size_t i = 0; i < hooked_.size(); ++i) hooked_[i].remove_hook(hook_handles_[i]);
  for (Layer& layer : layers_)
    if (layer.work) {
      try {
        layer.work->wait();
      } catch (...) {  // a failed gather reported nothing yet; the group is broken anyway
      }
    }
}

std::int64_t ZeroLayers::layerCount() const { return static_cast<std::int64_t>(layers_.size()); }

std::int64_t ZeroLayers::widestLayer() const {
  std::int64_t widest = 0;
  for (const Layer& layer : layers_) widest = std::max(widest, layer.end - layer.begin);
  return widest;
}

int ZeroLayers::gatheredLayers() const {
  int gathered = 0;
  for (const Layer& layer : layers_) gathered += layer.gathered ? 1 : 0;
  return gathered;
}

void ZeroLayers::startGather(int l) {
  Layer& layer = layers_.at(l);
  if (layer.gathered || layer.end == layer.begin) return;
  allocateStorageBytes(layer.buffer);
  layer.gathered = true;
  layer.work = communicator_->allGatherV(layer.piece, layer.buffer, layer.counts);
}

void ZeroLayers::awaitGather(int l) {
  startGather(l);
  Layer& layer = layers_[l];
  if (!layer.work) return;
  comm::Work work = *layer.work;
  layer.work.reset();
  if (work.isCompleted() || !wait_hooks_.begin) {
    work.wait();
    return;
  }
  wait_hooks_.begin();
  try {
    work.wait();
  } catch (...) {
    wait_hooks_.end();
    throw;
  }
  wait_hooks_.end();
}

void ZeroLayers::free(int l) {
  Layer& layer = layers_[l];
  if (!layer.gathered) return;
  if (layer.work) awaitGather(l);  // the transport may still write into the bytes
  dropStorageBytes(layer.buffer);
  layer.gathered = false;
}

at::Tensor ZeroLayers::forward(model::ZooModel& model, at::Tensor x) {
  CHORUS_CHECK_CONFIG(model.numLayers() == layerCount(), "ZeRO-3: the model has ",
                      model.numLayers(), " layers, the shards ", layerCount());
  const bool recording = at::GradMode::is_enabled();
  const int last = static_cast<int>(layerCount()) - 1;
  if (recording) recording_ = true;
  if (last >= 0) startGather(0);
  for (int l = 0; l <= last; ++l) {
    awaitGather(l);
    if (l < last) startGather(l + 1);
    x = model.forwardRange(l, l + 1, std::move(x));
    if (recording) {
      layers_[l].pending = layers_[l].trained;
      if (x.requires_grad()) x.register_hook([this, l](const at::Tensor&) { onOutputGradient(l); });
    }
    if (!recording || l < last) free(l);
  }
  return x;
}

void ZeroLayers::onOutputGradient(int l) {
  awaitGather(l);
  if (l > 0) startGather(l - 1);
}

void ZeroLayers::onParameterGradient(int l) {
  Layer& layer = layers_[l];
  if (!recording_ || layer.pending <= 0) return;
  if (--layer.pending == 0) free(l);
}

void ZeroLayers::gatherAll() {
  for (int l = 0; l < static_cast<int>(layers_.size()); ++l) startGather(l);
  for (int l = 0; l < static_cast<int>(layers_.size()); ++l) awaitGather(l);
}

void ZeroLayers::release() {
  for (int l = 0; l < static_cast<int>(layers_.size()); ++l) {
    free(l);
    layers_[l].pending = 0;
  }
  recording_ = false;
}

}  // namespace chorus::parallel
