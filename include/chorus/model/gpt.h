// The decoder-only transformer of the zoo (a small GPT), for character-level language modelling
// and for pipeline parallelism with many equal layers.
//
// Layers: "embed" (token + position embeddings), "block1" … "blockN" (pre-LayerNorm transformer
// blocks: x + attention(LN(x)), then x + MLP(LN(x)) with a 4·width GELU hidden layer), and
// "head" (final LayerNorm, then a Linear to the vocabulary without bias; not tied to the token
// embedding, so that every parameter belongs to exactly one layer and a pipeline can cut anywhere).
// Causal self-attention is written out with matmuls, a causal mask and softmax instead of a fused
// scaled_dot_product_attention, whose fast paths may be nondeterministic or differ by backend.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chorus/model/layered_model.h"
#include "chorus/model/model_config.h"

namespace chorus::model {

// Input: int64 token ids [B, T], T <= context; output: logits [B, T, vocab], position t
// predicting token t+1 from tokens 0..t only. Targets for lossSum and correct: int64 [B, T].
// Cost per sample at T = context and w = width (LayerProfile):
//   embed  0 FLOPs (table look-ups), T·w·4 bytes out
//   block  2·T·w·3w (QKV) + 2·T²·w (scores) + 2·T²·w (weighted sum) + 2·T·w² (projection)
//          + 2·T·w·4w·2 (MLP) FLOPs, T·w·4 bytes out
//   head   2·T·w·vocab FLOPs, T·vocab·4 bytes out
class Gpt : public LayeredModel {
 public:
  // Builds and initializes the model GPT-2 style, from a generator seeded with `seed`: embeddings
  // and Linear weights ~ N(0, 0.02²), the residual projections (attention output, MLP output)
  // ~ N(0, (0.02/√(2·layers))²) so the residual stream's variance does not grow with depth,
  // biases 0, LayerNorm scale 1 and shift 0. Throws ConfigError unless config.kind is "gpt" and
  // validateModelConfig accepts `config`.
  Gpt(const ModelConfig& config, std::uint64_t seed);
  ~Gpt() override;

  // Σ over samples of the mean over positions of the next-token cross-entropy.
  at::Tensor lossSum(const at::Tensor& outputs, const at::Tensor& targets) const override;
  // Positions whose argmax is the target token, over the whole batch.
  std::int64_t correct(const at::Tensor& outputs, const at::Tensor& targets) const override;
  std::string describe() const override;

  const ModelConfig& config() const { return config_; }

 private:
  ModelConfig config_;
};

}  // namespace chorus::model
