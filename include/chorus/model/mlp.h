// The multi-layer perceptron of the zoo: the smallest model, for fast tests and for runs where
// communication, not compute, should dominate.
//
// Layers: "fc1" … "fcN", one per entry of ModelConfig::hidden, each Linear + ReLU (the first also
// flattens the input), then "head", a Linear to the classes (logits, no activation).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chorus/model/layered_model.h"
#include "chorus/model/model_config.h"

namespace chorus::model {

// Input: float [B, input_shape...]; output: logits [B, classes]. Cost per sample (LayerProfile):
// a Linear in → out is 2·in·out FLOPs and writes out·4 bytes.
class Mlp : public ImageClassifier {
 public:
  // Builds and initializes the model: weights and biases ~ U(-1/√in, 1/√in) (PyTorch's default)
  // drawn from a generator seeded with `seed`. Throws ConfigError unless config.kind is "mlp" and
  // validateModelConfig accepts `config`.
  Mlp(const ModelConfig& config, std::uint64_t seed);
  ~Mlp() override;

  std::string describe() const override;

  const ModelConfig& config() const { return config_; }

 private:
  ModelConfig config_;
};

}  // namespace chorus::model
