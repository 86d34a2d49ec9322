// The interface every model of the zoo implements.
//
// A zoo model is a sequence of layers [0, numLayers()), so the same object serves plain and uneven
// data parallelism (forward over all layers) and pipeline parallelism (each stage runs a contiguous
// range through forwardRange). profile() gives the planner each layer's size and cost per sample,
// from analytic formulas in the model's dimensions, so a plan can be made before anything runs.
//
// The loss is a SUM over samples: a rank of an uneven data-parallel job takes any number of the
// global batch's samples, and the trainer divides the all-reduced sum by the global batch size B,
// which reproduces single-device training on the mean loss whatever the split.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

namespace chorus::model {

// Size and cost of one layer, per sample: the planner's input.
struct LayerProfile {
  // The layer's name, e.g. "stem", "block3", "head".
  std::string name;
  // Trainable scalars in this layer. Summed over the layers this is the model's total, exactly.
  std::int64_t parameters = 0;
  // Forward FLOPs for ONE sample, counting a multiply-add as 2 FLOPs. Only matrix products
  // (linear layers, convolutions, attention) are counted; element-wise work (bias, norms,
  // activations, softmax, pooling) is lower order and left out. Backward costs about 2x forward.
  double forward_flops = 0;
  // Bytes of this layer's output for one sample in fp32: what a pipeline stage sends on, and
  // what activation memory holds per layer.
  std::int64_t activation_bytes = 0;
};

// A model of the zoo. Implementations build their parameters on the CPU, deterministically for a
// seed (see makeModel); move them with to(device) afterwards. Not safe for concurrent use: like any
// torch::nn::Module, one thread runs forward and backward at a time.
class ZooModel : public torch::nn::Module {
 public:
  ~ZooModel() override = default;

  // The model is layers [0, numLayers()); forward = forwardRange(0, numLayers(), x).
  virtual std::int64_t numLayers() const = 0;
  // Runs layers [first, last) on `x`, the output of layer first-1 (or the model input when first
  // is 0). REQUIRES: 0 <= first <= last <= numLayers(), else ConfigError. An empty range returns
  // `x` unchanged. Composition is exact: forwardRange(a, b, forwardRange(0, a, x)) equals
  // forward(x) bit for bit, which pipeline stages rely on.
  virtual at::Tensor forwardRange(std::int64_t first, std::int64_t last, at::Tensor x) = 0;
  at::Tensor forward(at::Tensor x) { return forwardRange(0, numLayers(), std::move(x)); }

  // The SUM over the samples of the per-sample loss (for the GPT: the per-sample loss is the mean
  // cross-entropy over its tokens). The trainer divides by the global batch B, so gradients equal
  // single-device training on the mean loss.
  virtual at::Tensor lossSum(const at::Tensor& outputs, const at::Tensor& targets) const = 0;
  // Number of correct predictions (classification: argmax == label; GPT: correct next tokens).
  virtual std::int64_t correct(const at::Tensor& outputs, const at::Tensor& targets) const = 0;

  // One entry per layer, in order.
  virtual std::vector<LayerProfile> profile() const = 0;
  // One line for logs, e.g. "cnn(channels=32, blocks=2): 1.2 M parameters".
  virtual std::string describe() const = 0;

  // Trainable scalars of the whole model.
  std::int64_t parameterCount() const;
  // The parameters of layer `layer` (its child module's, recursively), in registration order: a
  // zoo model registers exactly its layers as its children, in order (model/common.h), which is
  // what lets a pipeline stage or ZeRO-3 find a layer's own. Throws ConfigError when the model's
  // children are not its layers or `layer` is out of range.
  std::vector<at::Tensor> layerParameters(std::int64_t layer) const;

 protected:
  // Throws ConfigError unless 0 <= first <= last <= numLayers().
  void checkRange(std::int64_t first, std::int64_t last) const;
  // "1.2 M", "235.1 k", "96": a parameter count for describe().
  static std::string formatCount(std::int64_t count);
};

}  // namespace chorus::model
