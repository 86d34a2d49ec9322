// The residual convolutional network of the zoo: the image model with the most compute per
// parameter, so that devices of different speeds differ visibly.
//
// Layers: "stem" (3×3 convolution, stride 2, from input channels to `channels`, then GroupNorm
// and ReLU), "block1" … "blockN" (residual: conv-norm-relu-conv-norm, plus the input, then ReLU;
// resolution and channels kept), and "head" (average pool to a 4×4 grid, flatten, then Linear to
// the classes). The stem halves the resolution so that a 28×28 image costs a quarter of the FLOPs
// in every block: on 2 CPU cores a step must stay well under a second.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chorus/model/layered_model.h"
#include "chorus/model/model_config.h"

namespace chorus::model {

// Input: float [B, C, H, W] with {C, H, W} = input_shape; output: logits [B, classes].
// Cost per sample (LayerProfile), with C' = channels and H' = ⌊(H−1)/2⌋+1, W' likewise:
//   stem   2·C·C'·9·H'·W' FLOPs, C'·H'·W'·4 bytes out
//   block  2 · 2·C'·C'·9·H'·W' FLOPs (two convolutions), C'·H'·W'·4 bytes out
//   head   2·16·C'·classes FLOPs, classes·4 bytes out
class Cnn : public ImageClassifier {
 public:
  // Builds and initializes the model: convolution and linear weights and biases
  // ~ U(-1/√fan_in, 1/√fan_in) (PyTorch's default), GroupNorm scale 1 and shift 0, drawn from a
  // generator seeded with `seed`. Convolutions followed by GroupNorm have no bias (the norm's
  // shift replaces it). Throws ConfigError unless config.kind is "cnn" and validateModelConfig
  // accepts `config`.
  Cnn(const ModelConfig& config, std::uint64_t seed);
  ~Cnn() override;

  std::string describe() const override;

  const ModelConfig& config() const { return config_; }

 private:
  ModelConfig config_;
};

}  // namespace chorus::model
