// Shapes and per-layer formulas of the named transformers.
//
// GPT-3: Brown et al., "Language Models are Few-Shot Learners" (NeurIPS'20), Table 2.1 (n_layers,
// d_model, n_heads; n_ctx = 2048; 4 x d_model MLP; GPT-2 vocabulary of 50,257). The table gives the
// 1.3B model 24 heads of 128 although 24 x 128 != 2048; we use 16 heads of 128 as d_model implies.
// 13B: d_model 5,140 in the table; 5,120 (40 heads x 128) is the width that trains, we use it.
// LLaMA 7B/13B: Touvron et al., "LLaMA: Open and Efficient Foundation Language Models" (2023),
// Table 2 (dim, heads, layers), 2,048 context, SwiGLU with 2/3 x 4d rounded up to 256 (11,008 and
// 13,824), 32,000-token vocabulary. LLaMA 70B: Touvron et al., "Llama 2" (2023): 80 layers, dim
// 8,192, 64 heads with 8 key/value heads (GQA), MLP 28,672, 4,096 context.
#include "chorus/plan/transformer_shapes.h"

#include "chorus/core/error.h"
#include "chorus/core/named_catalog.h"

namespace chorus::plan {
namespace {

constexpr double kHalf = 2;  // bytes per 16-bit element

TransformerShape gpt3(const char* name, int layers, int hidden, int heads) {
  return {name, layers, hidden, heads, heads, 4 * hidden, 50257, 2048, false, true};
}

TransformerShape llama(const char* name, int layers, int hidden, int heads, int kv_heads, int ffn,
                       int seq) {
  return {name, layers, hidden, heads, kv_heads, ffn, 32000, seq, true, false};
}

// One transformer block. Per sample of s tokens, h hidden, a heads, kv width k, MLP width f:
// FLOPs: 2 x (weights touched per token) x s for the projections, plus 4 s^2 h for QK^T and AV.
// Activations (bytes, 16-bit): Korthikanti et al. count 34 s h + 5 a s^2 for a GPT block (with
// dropout); for a LLaMA block (no dropout, RMSNorm, SwiGLU, GQA) the same accounting gives
// 12 s h + 4 s k + 8 s f + 2 a s^2.
LayerProfile block(const TransformerShape& shape, int index) {
  const double s = shape.seq_len, h = shape.hidden, a = shape.heads, f = shape.ffn_hidden;
  const double k = h * shape.kv_heads / shape.heads;
  LayerProfile layer;
  layer.name = "block." + std::to_string(index);
  const double attention_weights = 2 * h * h + 2 * h * k;
  const double mlp_weights = (shape.gated_mlp ? 3 : 2) * h * f;
  if (shape.gated_mlp) {
    layer.params = attention_weights + mlp_weights + 2 * h;
    layer.activation_bytes = 12 * s * h + 4 * s * k + 8 * s * f + 2 * a * s * s;
  } else {
    // Biases of QKV (3h), output (h), MLP (f + h) and two LayerNorms (4h): 12 h^2 + 13 h at f = 4h.
    layer.params = attention_weights + mlp_weights + 9 * h + f;
    layer.activation_bytes = 34 * s * h + 5 * a * s * s;
  }
  layer.forward_flops = 2 * s * (attention_weights + mlp_weights) + 4 * s * s * h;
  layer.output_bytes = kHalf * s * h;
  return layer;
}

}  // namespace

ModelProfile transformerProfile(const TransformerShape& shape) {
  CHORUS_CHECK_CONFIG(shape.layers > 0 && shape.hidden > 0 && shape.heads > 0 &&
                          shape.kv_heads > 0 && shape.ffn_hidden > 0 && shape.vocab > 0 &&
                          shape.seq_len > 0,
                      "transformer shape '", shape.name, "' has a non-positive dimension");
  const double s = shape.seq_len, h = shape.hidden, v = shape.vocab;
  ModelProfile model;
  model.name = shape.name;
  model.activation_element_bytes = 2;
  // Embedding: a lookup (no matmul FLOPs); keeps nothing but its output.
  LayerProfile embedding{"embedding", v * h + (shape.learned_positions ? s * h : 0), 0,
                         kHalf * s * h, kHalf * s * h};
  model.layers.push_back(embedding);
  for (int i = 0; i < shape.layers; ++i) model.layers.push_back(block(shape, i));
  // Head: final norm and the vocabulary projection (GPT-3 ties it to the embedding; Megatron keeps
  // a copy on the last pipeline stage, which is what we count), then the loss. Keeps its input,
  // the 16-bit logits and an fp32 softmax for the loss gradient: 2 s h + 6 s v bytes.
  LayerProfile head{"head", v * h + 2 * h, 2 * s * h * v, kHalf * s * h + 6 * s * v, 4};
  model.layers.push_back(head);
  return model;
}

const std::vector<TransformerShape>& namedShapes() {
  static const std::vector<TransformerShape> shapes = {
      gpt3("gpt3-1.3b", 24, 2048, 16),
      gpt3("gpt3-2.7b", 32, 2560, 32),
      gpt3("gpt3-6.7b", 32, 4096, 32),
      gpt3("gpt3-13b", 40, 5120, 40),
      gpt3("gpt3-175b", 96, 12288, 96),
      llama("llama-7b", 32, 4096, 32, 32, 11008, 2048),
      llama("llama-13b", 40, 5120, 40, 40, 13824, 2048),
      llama("llama-70b", 80, 8192, 64, 8, 28672, 4096),
  };
  return shapes;
}

const TransformerShape* findShape(const std::string& name) {
  return findNamed(namedShapes(), name);
}

std::string knownModelNames() { return catalogNames(namedShapes()); }

ModelProfile resolveModel(const std::string& name_or_path) {
  if (endsWithIgnoringCase(name_or_path, ".json")) return loadModelFile(name_or_path);
  if (const TransformerShape* shape = findShape(name_or_path)) return transformerProfile(*shape);
  CHORUS_THROW(ConfigError, "unknown model '", name_or_path, "'; known: ", knownModelNames(),
               ", or a JSON profile file (*.json)");
}

}  // namespace chorus::plan
