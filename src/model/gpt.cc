#include "chorus/model/gpt.h"

#include <torch/nn/functional/dropout.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <limits>
#include <sstream>

#include "chorus/core/error.h"
#include "common.h"

namespace chorus::model {
namespace {

// GPT-2's initialization scale.
constexpr double kInitStd = 0.02;

// x through `layer` as one aten::linear (addmm with its bias): libtorch's C++ Linear::forward
// computes a matmul and then adds the bias for inputs of more than two dimensions, and under bf16
// autocast that add converts the fp32 bias on every call (1.4 ms of a small GPT's bf16 forward
// on a CPU, bench/single_device.py, 2026-12-04); PyTorch's nn.Linear calls aten::linear.
at::Tensor linear(const torch::nn::Linear& layer, const at::Tensor& x) {
  return at::linear(x, layer->weight, layer->bias.defined() ? layer->bias : at::Tensor());
}

at::Tensor maybeDropout(const at::Tensor& x, double p, bool training) {
  if (p == 0.0 || !training) return x;
  return torch::nn::functional::dropout(
      x, torch::nn::functional::DropoutFuncOptions().p(p).training(true));
}

void initLinear(const torch::nn::Linear& linear, double std, at::Generator& generator) {
  detail::normalInit(linear->weight, std, generator);
  if (linear->bias.defined()) detail::constantInit(linear->bias, 0.0);
}

void initLayerNorm(const torch::nn::LayerNorm& norm) {
  detail::constantInit(norm->weight, 1.0);
  detail::constantInit(norm->bias, 0.0);
}

torch::nn::LayerNorm layerNorm(std::int64_t width) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({width}));
}

class Embed : public detail::Layer {
 public:
  explicit Embed(const ModelConfig& config) : config_(config) {
    tokens_ = register_module("tokens", torch::nn::Embedding(config.vocab, config.width));
    positions_ = register_module("positions", torch::nn::Embedding(config.context, config.width));
  }
  at::Tensor forward(at::Tensor x) override {
    if (x.dim() != 2 || x.scalar_type() != at::kLong || x.size(1) < 1 ||
        x.size(1) > config_.context)
      CHORUS_THROW(ConfigError,
                   "gpt expects int64 token ids [B, T] with 1 <= T <= ", config_.context, ", got ",
                   x.scalar_type(), " ", x.sizes());
    const at::Tensor positions = at::arange(x.size(1), x.options());
    return maybeDropout(tokens_->forward(x) + positions_->forward(positions), config_.dropout,
                        is_training());
  }
  void initialize(at::Generator& generator) override {
    detail::normalInit(tokens_->weight, kInitStd, generator);
    detail::normalInit(positions_->weight, kInitStd, generator);
  }
  double forwardFlops() const override { return 0.0; }
  std::int64_t activationBytes() const override { return config_.context * config_.width * 4; }

 private:
  ModelConfig config_;
  torch::nn::Embedding tokens_{nullptr};
  torch::nn::Embedding positions_{nullptr};
};

class Block : public detail::Layer {
 public:
  explicit Block(const ModelConfig& config) : config_(config) {
    const std::int64_t w = config.width;
    attention_norm_ = register_module("attention_norm", layerNorm(w));
    qkv_ = register_module("qkv", torch::nn::Linear(w, 3 * w));
    attention_out_ = register_module("attention_out", torch::nn::Linear(w, w));
    mlp_norm_ = register_module("mlp_norm", layerNorm(w));
    mlp_in_ = register_module("mlp_in", torch::nn::Linear(w, 4 * w));
    mlp_out_ = register_module("mlp_out", torch::nn::Linear(4 * w, w));
  }

  at::Tensor forward(at::Tensor x) override {
    x = x + maybeDropout(linear(attention_out_, attention(attention_norm_->forward(x))),
                         config_.dropout, is_training());
    at::Tensor hidden = at::gelu(linear(mlp_in_, mlp_norm_->forward(x)));
    return x + maybeDropout(linear(mlp_out_, hidden), config_.dropout, is_training());
  }

  void initialize(at::Generator& generator) override {
    const double residual_std = kInitStd / std::sqrt(2.0 * static_cast<double>(config_.layers));
    initLayerNorm(attention_norm_);
    initLinear(qkv_, kInitStd, generator);
    initLinear(attention_out_, residual_std, generator);
    initLayerNorm(mlp_norm_);
    initLinear(mlp_in_, kInitStd, generator);
    initLinear(mlp_out_, residual_std, generator);
  }

  double forwardFlops() const override {
    const double t = static_cast<double>(config_.context);
    const double w = static_cast<double>(config_.width);
    return 2 * t * w * 3 * w + 2 * t * t * w + 2 * t * t * w + 2 * t * w * w +
           2 * t * w * 4 * w * 2;
  }
  std::int64_t activationBytes() const override { return config_.context * config_.width * 4; }

 private:
  // Causal multi-head self-attention on normalized x [B, T, w], before the output projection.
  // On a GPU through PyTorch's fused kernel (flash or memory-efficient attention), as a plain
  // PyTorch model with F.scaled_dot_product_attention runs it; on a CPU written out (matmul, mask,
  // softmax, matmul), which measured faster there: the fused CPU kernel halved a bf16 step
  // (bench/single_device.py, 2026-12-04).
  at::Tensor attention(const at::Tensor& x) {
    const std::int64_t batch = x.size(0), t = x.size(1), w = config_.width;
    const std::int64_t heads = config_.heads, d = w / heads;
    const std::vector<at::Tensor> qkv = linear(qkv_, x).split(w, /*dim=*/2);
    // [B, T, w] -> [B, heads, T, d]
    auto split_heads = [&](const at::Tensor& y) {
      return y.reshape({batch, t, heads, d}).transpose(1, 2);
    };
    const at::Tensor q = split_heads(qkv[0]);
    const at::Tensor k = split_heads(qkv[1]);
    const at::Tensor v = split_heads(qkv[2]);
    at::Tensor mixed;
    if (x.is_cuda()) {
      // Position i attends to positions <= i.
      const double dropout = is_training() ? config_.dropout : 0.0;
      mixed = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, dropout,
                                               /*is_causal=*/true);
    } else {
      at::Tensor scores = at::matmul(q, k.transpose(2, 3)) / std::sqrt(static_cast<double>(d));
      // Position i attends to positions <= i: the strict upper triangle is masked out.
      const at::Tensor future = at::ones({t, t}, x.options().dtype(at::kBool)).triu(1);
      scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
      const at::Tensor weights = maybeDropout(scores.softmax(-1), config_.dropout, is_training());
      mixed = at::matmul(weights, v);
    }
    return mixed.transpose(1, 2).reshape({batch, t, w});
  }

  ModelConfig config_;
  torch::nn::LayerNorm attention_norm_{nullptr};
  torch::nn::Linear qkv_{nullptr};
  torch::nn::Linear attention_out_{nullptr};
  torch::nn::LayerNorm mlp_norm_{nullptr};
  torch::nn::Linear mlp_in_{nullptr};
  torch::nn::Linear mlp_out_{nullptr};
};

class Head : public detail::Layer {
 public:
  explicit Head(const ModelConfig& config) : config_(config) {
    norm_ = register_module("norm", layerNorm(config.width));
    linear_ = register_module(
        "linear",
        torch::nn::Linear(torch::nn::LinearOptions(config.width, config.vocab).bias(false)));
  }
  at::Tensor forward(at::Tensor x) override { return linear(linear_, norm_->forward(x)); }
  void initialize(at::Generator& generator) override {
    initLayerNorm(norm_);
    initLinear(linear_, kInitStd, generator);
  }
  double forwardFlops() const override {
    return 2.0 * static_cast<double>(config_.context * config_.width * config_.vocab);
  }
  std::int64_t activationBytes() const override { return config_.context * config_.vocab * 4; }

 private:
  ModelConfig config_;
  torch::nn::LayerNorm norm_{nullptr};
  torch::nn::Linear linear_{nullptr};
};

void checkTargets(const at::Tensor& outputs, const at::Tensor& targets, const char* what) {
  if (outputs.dim() != 3 || targets.dim() != 2 || targets.size(0) != outputs.size(0) ||
      targets.size(1) != outputs.size(1))
    CHORUS_THROW(ConfigError, "gpt ", what, " needs logits [B, T, vocab] and targets [B, T], got ",
                 outputs.sizes(), " and ", targets.sizes());
}

}  // namespace

Gpt::Gpt(const ModelConfig& config, std::uint64_t seed) : config_(config) {
  detail::checkModelConfig(config, "gpt", "Gpt");
  layers().add(*this, "embed", std::make_shared<Embed>(config));
  for (std::int64_t i = 1; i <= config.layers; ++i)
    layers().add(*this, "block" + std::to_string(i), std::make_shared<Block>(config));
  layers().add(*this, "head", std::make_shared<Head>(config));
  layers().initialize(seed);
}

Gpt::~Gpt() = default;

at::Tensor Gpt::lossSum(const at::Tensor& outputs, const at::Tensor& targets) const {
  checkTargets(outputs, targets, "loss");
  namespace F = torch::nn::functional;
  const at::Tensor per_token =
      F::cross_entropy(outputs.reshape({-1, outputs.size(2)}), targets.reshape({-1}),
                       F::CrossEntropyFuncOptions().reduction(torch::kNone));
  return per_token.view({outputs.size(0), outputs.size(1)}).mean(1).sum();
}

std::int64_t Gpt::correct(const at::Tensor& outputs, const at::Tensor& targets) const {
  checkTargets(outputs, targets, "accuracy");
  return outputs.argmax(2).eq(targets).sum().item<std::int64_t>();
}

std::string Gpt::describe() const {
  std::ostringstream out;
  out << "gpt(layers=" << config_.layers << ", width=" << config_.width
      << ", heads=" << config_.heads << ", context=" << config_.context
      << ", vocab=" << config_.vocab << "): " << formatCount(parameterCount()) << " parameters";
  return out.str();
}

}  // namespace chorus::model
