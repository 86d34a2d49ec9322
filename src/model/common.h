// Private to the model layer: the building blocks the zoo's models share.
//
// Every zoo model is a list of Layer modules run in order; the helpers here run a range of them,
// profile them, draw their parameters from a local generator, and compute the classification
// loss. Keeping the loop in one place is what makes forwardRange compose exactly for every model.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chorus/model/model_config.h"
#include "chorus/model/zoo_model.h"

namespace chorus::model::detail {

// One layer of a zoo model: a module with a single-tensor forward, its own initialization, and
// its analytic per-sample cost (see LayerProfile for what is counted).
class Layer : public torch::nn::Module {
 public:
  virtual at::Tensor forward(at::Tensor x) = 0;
  // Redraws every parameter from `generator`, in a fixed order.
  virtual void initialize(at::Generator& generator) = 0;
  virtual double forwardFlops() const = 0;
  virtual std::int64_t activationBytes() const = 0;
};

// The layers of a model with their names, in order. Registers each layer with its owner module
// under its name, so parameter names read "block1.conv1.weight".
class LayerList {
 public:
  void add(torch::nn::Module& owner, const std::string& name, std::shared_ptr<Layer> layer);
  std::int64_t size() const { return static_cast<std::int64_t>(layers_.size()); }
  // Runs layers [first, last) in order; the caller has checked the range.
  at::Tensor run(std::int64_t first, std::int64_t last, at::Tensor x) const;
  // Initializes every layer, in order, from one generator seeded with `seed`.
  void initialize(std::uint64_t seed) const;
  std::vector<LayerProfile> profile() const;

 private:
  std::vector<std::string> names_;
  std::vector<std::shared_ptr<Layer>> layers_;
};

// In-place, without autograd: `tensor` ~ U(-bound, bound).
void uniformInit(const at::Tensor& tensor, double bound, at::Generator& generator);
// In-place, without autograd: `tensor` ~ N(0, std^2).
void normalInit(const at::Tensor& tensor, double std, at::Generator& generator);
// In-place, without autograd: `tensor` = value.
void constantInit(const at::Tensor& tensor, double value);
// PyTorch's default for Linear and Conv layers: weight and bias ~ U(-1/sqrt(fan_in), ...), with
// fan_in the inputs per output (in_features, or in_channels * k * k). `bias` may be undefined.
void fanInInit(const at::Tensor& weight, const at::Tensor& bias, std::int64_t fan_in,
               at::Generator& generator);

// Σ over samples of cross-entropy, for logits [B, classes] and int64 labels [B].
at::Tensor classificationLossSum(const at::Tensor& outputs, const at::Tensor& targets);
// Samples whose argmax equals their label.
std::int64_t classificationCorrect(const at::Tensor& outputs, const at::Tensor& targets);

// A model's constructor's check of its config: throws ConfigError unless config.kind is `kind`
// ("Cnn built from a config of kind ...", naming `model_class`) and validateModelConfig accepts it.
void checkModelConfig(const ModelConfig& config, const char* kind, const char* model_class);

}  // namespace chorus::model::detail
