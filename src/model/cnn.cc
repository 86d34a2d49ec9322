#include "chorus/model/cnn.h"

#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <sstream>

#include "chorus/core/error.h"
#include "common.h"

namespace chorus::model {
namespace {

constexpr std::int64_t kKernel = 3;

// A 3×3 convolution with padding 1, followed by GroupNorm when groups > 0 (then without bias).
class ConvNorm : public torch::nn::Module {
 public:
  ConvNorm(std::int64_t in, std::int64_t out, std::int64_t stride, std::int64_t groups) : in_(in) {
    conv_ = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, kKernel)
                                                          .stride(stride)
                                                          .padding(1)
                                                          .bias(groups == 0)));
    if (groups > 0)
      norm_ =
          register_module("norm", torch::nn::GroupNorm(torch::nn::GroupNormOptions(groups, out)));
  }

  at::Tensor forward(const at::Tensor& x) {
    at::Tensor y = conv_->forward(x);
    return norm_ ? norm_->forward(y) : y;
  }

  void initialize(at::Generator& generator) {
    detail::fanInInit(conv_->weight, conv_->bias, in_ * kKernel * kKernel, generator);
    if (norm_) {
      detail::constantInit(norm_->weight, 1.0);
      detail::constantInit(norm_->bias, 0.0);
    }
  }

 private:
  std::int64_t in_;
  torch::nn::Conv2d conv_{nullptr};
  torch::nn::GroupNorm norm_{nullptr};
};

// Per-sample FLOPs of a 3×3 convolution in → out producing an h × w map.
double convFlops(std::int64_t in, std::int64_t out, std::int64_t h, std::int64_t w) {
  return 2.0 * static_cast<double>(in * out * kKernel * kKernel) * static_cast<double>(h * w);
}

class Stem : public detail::Layer {
 public:
  Stem(const ModelConfig& config, std::int64_t h, std::int64_t w)
      : in_(config.input_shape[0]), out_(config.channels), h_(h), w_(w) {
    unit_ = register_module("unit", std::make_shared<ConvNorm>(in_, out_, 2, config.groups));
  }
  at::Tensor forward(at::Tensor x) override {
    if (x.dim() != 4 || x.size(1) != in_)
      CHORUS_THROW(ConfigError, "cnn expects inputs [B, ", in_, ", H, W], got ", x.sizes());
    return unit_->forward(x).relu();
  }
  void initialize(at::Generator& generator) override { unit_->initialize(generator); }
  double forwardFlops() const override { return convFlops(in_, out_, h_, w_); }
  std::int64_t activationBytes() const override { return out_ * h_ * w_ * 4; }

 private:
  std::int64_t in_, out_, h_, w_;
  std::shared_ptr<ConvNorm> unit_;
};

class ResidualBlock : public detail::Layer {
 public:
  ResidualBlock(const ModelConfig& config, std::int64_t h, std::int64_t w)
      : channels_(config.channels), h_(h), w_(w) {
    first_ = register_module("first",
                             std::make_shared<ConvNorm>(channels_, channels_, 1, config.groups));
    second_ = register_module("second",
                              std::make_shared<ConvNorm>(channels_, channels_, 1, config.groups));
  }
  at::Tensor forward(at::Tensor x) override {
    at::Tensor branch = second_->forward(first_->forward(x).relu());
    return (x + branch).relu();
  }
  void initialize(at::Generator& generator) override {
    first_->initialize(generator);
    second_->initialize(generator);
  }
  double forwardFlops() const override { return 2.0 * convFlops(channels_, channels_, h_, w_); }
  std::int64_t activationBytes() const override { return channels_ * h_ * w_ * 4; }

 private:
  std::int64_t channels_, h_, w_;
  std::shared_ptr<ConvNorm> first_;
  std::shared_ptr<ConvNorm> second_;
};

// Pools to a coarse kHeadGrid × kHeadGrid map rather than to one value per channel: a global
// average throws away where in the image a feature was, which costs Fashion-MNIST accuracy (the
// default job reaches its target in far fewer steps with the grid).
constexpr std::int64_t kHeadGrid = 4;

class Head : public detail::Layer {
 public:
  explicit Head(const ModelConfig& config)
      : in_(config.channels * kHeadGrid * kHeadGrid), out_(config.classes) {
    linear_ = register_module("linear", torch::nn::Linear(in_, out_));
  }
  at::Tensor forward(at::Tensor x) override {
    return linear_->forward(at::adaptive_avg_pool2d(x, {kHeadGrid, kHeadGrid}).flatten(1));
  }
  void initialize(at::Generator& generator) override {
    detail::fanInInit(linear_->weight, linear_->bias, in_, generator);
  }
  double forwardFlops() const override { return 2.0 * static_cast<double>(in_ * out_); }
  std::int64_t activationBytes() const override { return out_ * 4; }

 private:
  std::int64_t in_, out_;
  torch::nn::Linear linear_{nullptr};
};

}  // namespace

Cnn::Cnn(const ModelConfig& config, std::uint64_t seed) : config_(config) {
  detail::checkModelConfig(config, "cnn", "Cnn");
  // Output size of the stride-2, padding-1, 3×3 stem.
  const std::int64_t h = (config.input_shape[1] - 1) / 2 + 1;
  const std::int64_t w = (config.input_shape[2] - 1) / 2 + 1;
  layers().add(*this, "stem", std::make_shared<Stem>(config, h, w));
  for (std::int64_t i = 1; i <= config.blocks; ++i)
    layers().add(*this, "block" + std::to_string(i), std::make_shared<ResidualBlock>(config, h, w));
  layers().add(*this, "head", std::make_shared<Head>(config));
  layers().initialize(seed);
}

Cnn::~Cnn() = default;

std::string Cnn::describe() const {
  std::ostringstream out;
  out << "cnn(channels=" << config_.channels << ", blocks=" << config_.blocks
      << ", groups=" << config_.groups << ", classes=" << config_.classes
      << "): " << formatCount(parameterCount()) << " parameters";
  return out.str();
}

}  // namespace chorus::model
