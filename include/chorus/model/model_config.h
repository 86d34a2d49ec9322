// The model zoo's configuration and its factory.
//
// One ModelConfig describes any model of the zoo; `kind` picks the model and the fields of that
// kind apply (the others are ignored). makeModel validates the config and builds the model with
// parameters drawn from a generator seeded by `seed` alone, so every process of a job that builds
// the same config with the same seed holds bit-identical parameters without a broadcast.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chorus/model/zoo_model.h"

namespace chorus::model {

struct ModelConfig {
  // Which model: "mlp", "cnn" or "gpt". Default: "cnn".
  std::string kind = "cnn";

  // --- Image classifiers (mlp, cnn) ---
  // Shape of one input sample, {channels, height, width}. The MLP flattens any shape; the CNN
  // needs exactly three dimensions. Default: {1, 28, 28} (Fashion-MNIST).
  std::vector<std::int64_t> input_shape = {1, 28, 28};
  // Number of classes of the output. Default: 10.
  std::int64_t classes = 10;

  // --- mlp ---
  // Widths of the hidden layers, each Linear + ReLU; may be empty (a linear classifier).
  // Default: {256, 128}.
  std::vector<std::int64_t> hidden = {256, 128};

  // --- cnn ---
  // Channels of the stem and of every residual block. Default: 32.
  std::int64_t channels = 32;
  // Number of residual blocks between the stem and the head. Default: 2.
  std::int64_t blocks = 2;
  // GroupNorm groups after each convolution; 0 disables normalization. GroupNorm rather than
  // BatchNorm because its statistics are per sample: BatchNorm's batch statistics would make a
  // rank's output depend on which other samples share its micro-batch, and uneven data
  // parallelism would no longer equal single-device training. REQUIRES: channels % groups == 0.
  // Default: 8.
  std::int64_t groups = 8;

  // --- gpt ---
  // Vocabulary size (token ids are in [0, vocab)). Default: 96; the trainer sets it from the
  // corpus.
  std::int64_t vocab = 96;
  // Number of transformer blocks. Default: 4.
  std::int64_t layers = 4;
  // Embedding width. REQUIRES: width % heads == 0. Default: 128.
  std::int64_t width = 128;
  // Attention heads per block. Default: 4.
  std::int64_t heads = 4;
  // Longest sequence the model accepts (size of the position embedding). Default: 64.
  std::int64_t context = 64;
  // Dropout probability on the embeddings, attention weights and residual branches, active in
  // training mode only. Its masks come from torch's global generator, so a job with dropout is
  // reproducible only as far as every process seeds that generator alike. Default: 0.0, which
  // keeps training deterministic (equivalence tests rely on it).
  double dropout = 0.0;
};

// The kinds makeModel knows, in the order error messages list them: {"mlp", "cnn", "gpt"}.
const std::vector<std::string>& modelKinds();

// Throws ConfigError naming the offending field (e.g. "model.width") unless `config` describes a
// model that can be built. Only the fields of config.kind are checked.
void validateModelConfig(const ModelConfig& config);

// Builds the model `config` describes, on the CPU, in training mode. Every parameter is drawn from
// a local CPU generator seeded with `seed`, so the result depends on (config, seed) only: the same
// in every process and on every run, whatever other threads do with torch's global generator
// (which the torch::nn constructors still advance before their values are overwritten).
// Throws ConfigError (validateModelConfig).
std::shared_ptr<ZooModel> makeModel(const ModelConfig& config, std::uint64_t seed);

}  // namespace chorus::model
