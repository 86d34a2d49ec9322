#include "common.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/loss.h>
#include <torch/utils.h>

#include <cmath>

#include "chorus/core/error.h"

namespace chorus::model::detail {

void LayerList::add(torch::nn::Module& owner, const std::string& name,
                    std::shared_ptr<Layer> layer) {
  owner.register_module(name, layer);
  names_.push_back(name);
  layers_.push_back(std::move(layer));
}

at::Tensor LayerList::run(std::int64_t first, std::int64_t last, at::Tensor x) const {
  for (std::int64_t i = first; i < last; ++i) x = layers_[static_cast<std::size_t>(i)]->forward(x);
  return x;
}

void LayerList::initialize(std::uint64_t seed) const {
  // One generator for the whole model, consumed layer by layer in order: the values depend on
  // the seed and the architecture only, never on torch's global generator.
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (const auto& layer : layers_) layer->initialize(generator);
}

std::vector<LayerProfile> LayerList::profile() const {
  std::vector<LayerProfile> profiles;
  profiles.reserve(layers_.size());
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    LayerProfile entry;
    entry.name = names_[i];
    for (const at::Tensor& parameter : layers_[i]->parameters(/*recurse=*/true))
      if (parameter.requires_grad()) entry.parameters += parameter.numel();
    entry.forward_flops = layers_[i]->forwardFlops();
    entry.activation_bytes = layers_[i]->activationBytes();
    profiles.push_back(std::move(entry));
  }
  return profiles;
}

void uniformInit(const at::Tensor& tensor, double bound, at::Generator& generator) {
  torch::NoGradGuard no_grad;
  tensor.uniform_(-bound, bound, generator);
}

void normalInit(const at::Tensor& tensor, double std, at::Generator& generator) {
  torch::NoGradGuard no_grad;
  tensor.normal_(0.0, std, generator);
}

void constantInit(const at::Tensor& tensor, double value) {
  torch::NoGradGuard no_grad;
  tensor.fill_(value);
}

void fanInInit(const at::Tensor& weight, const at::Tensor& bias, std::int64_t fan_in,
               at::Generator& generator) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  uniformInit(weight, bound, generator);
  if (bias.defined()) uniformInit(bias, bound, generator);
}

at::Tensor classificationLossSum(const at::Tensor& outputs, const at::Tensor& targets) {
  if (outputs.dim() != 2 || targets.dim() != 1 || targets.size(0) != outputs.size(0))
    CHORUS_THROW(ConfigError, "classification loss needs logits [B, classes] and labels [B], got ",
                 outputs.sizes(), " and ", targets.sizes());
  namespace F = torch::nn::functional;
  return F::cross_entropy(outputs, targets, F::CrossEntropyFuncOptions().reduction(torch::kSum));
}

std::int64_t classificationCorrect(const at::Tensor& outputs, const at::Tensor& targets) {
  if (outputs.dim() != 2 || targets.dim() != 1 || targets.size(0) != outputs.size(0))
    CHORUS_THROW(ConfigError, "classification accuracy needs logits [B, classes] and labels [B], ",
                 "got ", outputs.sizes(), " and ", targets.sizes());
  return outputs.argmax(1).eq(targets).sum().item<std::int64_t>();
}

void checkModelConfig(const ModelConfig& config, const char* kind, const char* model_class) {
  CHORUS_CHECK_CONFIG(config.kind == kind, model_class, " built from a config of kind \"",
                      config.kind, "\"");
  validateModelConfig(config);
}

}  // namespace chorus::model::detail
