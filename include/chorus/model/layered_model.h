// What the zoo's models share: each is a list of layers (model/common.h's LayerList) that it runs
// a range of and profiles layer by layer, and the image classifiers (mlp, cnn) share their loss.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "chorus/model/zoo_model.h"

namespace chorus::model {

namespace detail {
class LayerList;
}

// A zoo model made of a list of layers, which its constructor adds (layers().add) and initializes.
class LayeredModel : public ZooModel {
 public:
  ~LayeredModel() override;

  std::int64_t numLayers() const override;
  at::Tensor forwardRange(std::int64_t first, std::int64_t last, at::Tensor x) override;
  std::vector<LayerProfile> profile() const override;

 protected:
  LayeredModel();
  detail::LayerList& layers() { return *layers_; }

 private:
  std::unique_ptr<detail::LayerList> layers_;
};

// A layered model whose output is class logits [B, classes] for int64 labels [B].
class ImageClassifier : public LayeredModel {
 public:
  // Σ over samples of cross-entropy.
  at::Tensor lossSum(const at::Tensor& outputs, const at::Tensor& targets) const override;
  // Samples whose argmax equals their label.
  std::int64_t correct(const at::Tensor& outputs, const at::Tensor& targets) const override;
};

}  // namespace chorus::model
