// Named transformer shapes: GPT-3 and LLaMA models as planner profiles, from their papers'
// hyper-parameters, so a user can plan `--model gpt3-175b` without the model itself.
//
// A shape becomes a ModelProfile of layers: the embedding, one layer per transformer block, and
// the head (final norm, vocabulary projection and loss). FLOPs follow Narayanan et al., "Efficient
// Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (SC'21, section 5.1);
// activation memory follows Korthikanti et al., "Reducing Activation Recomputation in Large
// Transformer Models" (MLSys'23, section 4.1, without tensor or sequence parallelism, attention
// scores kept, i.e. no flash attention). Sources of each shape's figures are in
// src/plan/model/transformer_shapes.cc.
#pragma once

#include <string>
#include <vector>

#include "chorus/plan/model_profile.h"

namespace chorus::plan {

// Hyper-parameters of a decoder-only transformer. Value type.
struct TransformerShape {
  std::string name;
  int layers = 0;
  int hidden = 0;
  int heads = 0;
  // Key/value heads (grouped-query attention); equal to `heads` for multi-head attention.
  int kv_heads = 0;
  // Inner width of the MLP.
  int ffn_hidden = 0;
  int vocab = 0;
  int seq_len = 0;
  // SwiGLU MLP (three matrices, LLaMA) instead of a GELU MLP (two matrices, GPT-3).
  bool gated_mlp = false;
  // Learned position embeddings (GPT-3) instead of rotary ones (LLaMA).
  bool learned_positions = false;
};

// The profile of `shape` with 16-bit activations (activation_element_bytes = 2).
ModelProfile transformerProfile(const TransformerShape& shape);

// gpt3-1.3b, gpt3-2.7b, gpt3-6.7b, gpt3-13b, gpt3-175b, llama-7b, llama-13b, llama-70b.
const std::vector<TransformerShape>& namedShapes();
const TransformerShape* findShape(const std::string& name);
std::string knownModelNames();

// A named shape's profile, or, when `name_or_path` ends in ".json", the profile in that file.
// Throws ConfigError naming the known shapes when neither applies.
ModelProfile resolveModel(const std::string& name_or_path);

}  // namespace chorus::plan
