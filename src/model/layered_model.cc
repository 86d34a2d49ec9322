#include "chorus/model/layered_model.h"

#include "common.h"

namespace chorus::model {

LayeredModel::LayeredModel() : layers_(std::make_unique<detail::LayerList>()) {}

LayeredModel::~LayeredModel() = default;

std::int64_t LayeredModel::numLayers() const { return layers_->size(); }

at::Tensor LayeredModel::forwardRange(std::int64_t first, std::int64_t last, at::Tensor x) {
  checkRange(first, last);
  return layers_->run(first, last, std::move(x));
}

std::vector<LayerProfile> LayeredModel::profile() const { return layers_->profile(); }

at::Tensor ImageClassifier::lossSum(const at::Tensor& outputs, const at::Tensor& targets) const {
  return detail::classificationLossSum(outputs, targets);
}

std::int64_t ImageClassifier::correct(const at::Tensor& outputs, const at::Tensor& targets) const {
  return detail::classificationCorrect(outputs, targets);
}

}  // namespace chorus::model
