#include "chorus/model/mlp.h"

#include <torch/nn/modules/linear.h>

#include <sstream>

#include "chorus/core/error.h"
#include "common.h"

namespace chorus::model {
namespace {

// Linear in → out, with a ReLU unless it is the head; the first layer flattens [B, ...] to [B, in].
class FullyConnected : public detail::Layer {
 public:
  FullyConnected(std::int64_t in, std::int64_t out, bool relu, bool flatten)
      : in_(in), out_(out), relu_(relu), flatten_(flatten) {
    linear_ = register_module("linear", torch::nn::Linear(in, out));
  }

  at::Tensor forward(at::Tensor x) override {
    if (flatten_) {
      if (x.dim() < 1 || x.numel() != x.size(0) * in_)
        CHORUS_THROW(ConfigError, "mlp expects inputs with ", in_, " features per sample, got ",
                     x.sizes());
      x = x.reshape({x.size(0), in_});
    }
    x = linear_->forward(x);
    return relu_ ? x.relu() : x;
  }

  void initialize(at::Generator& generator) override {
    detail::fanInInit(linear_->weight, linear_->bias, in_, generator);
  }

  double forwardFlops() const override { return 2.0 * in_ * out_; }
  std::int64_t activationBytes() const override { return out_ * 4; }

 private:
  std::int64_t in_;
  std::int64_t out_;
  bool relu_;
  bool flatten_;
  torch::nn::Linear linear_{nullptr};
};

}  // namespace

Mlp::Mlp(const ModelConfig& config, std::uint64_t seed) : config_(config) {
  detail::checkModelConfig(config, "mlp", "Mlp");
  std::int64_t in = 1;
  for (std::int64_t dim : config.input_shape) in *= dim;
  for (std::size_t i = 0; i < config.hidden.size(); ++i) {
    layers().add(*this, "fc" + std::to_string(i + 1),
                 std::make_shared<FullyConnected>(in, config.hidden[i], /*relu=*/true,
                                                  /*flatten=*/i == 0));
    in = config.hidden[i];
  }
  layers().add(*this, "head",
               std::make_shared<FullyConnected>(in, config.classes, /*relu=*/false,
                                                /*flatten=*/config.hidden.empty()));
  layers().initialize(seed);
}

Mlp::~Mlp() = default;

std::string Mlp::describe() const {
  std::ostringstream out;
  std::int64_t in = 1;
  for (std::int64_t dim : config_.input_shape) in *= dim;
  out << "mlp(input=" << in << ", hidden=";
  if (config_.hidden.empty()) out << "none";
  for (std::size_t i = 0; i < config_.hidden.size(); ++i)
    out << (i ? "x" : "") << config_.hidden[i];
  out << ", classes=" << config_.classes << "): " << formatCount(parameterCount()) << " parameters";
  return out.str();
}

}  // namespace chorus::model
