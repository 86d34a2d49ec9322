// Pieces of job TOML that several runtime tests train on, kept in one place so that a test's own
// job shows only what it changes. The tables are written from the values a test gives, key by
// key; a key a test leaves out is not written (the job's default holds).
#pragma once

#include <cstdint>
#include <optional>
#include <sstream>
#include <string>

namespace chorus::runtime::testing {

namespace detail {

// "key = value\n", or "" when there is no value.
template <typename Value>
std::string keyLine(const char* key, const std::optional<Value>& value) {
  if (!value) return "";
  std::ostringstream out;
  out << key << " = " << *value << "\n";
  return out.str();
}

// A float is written as TOML's float, with a point: 1.0, not 1.
inline std::string keyLine(const char* key, const std::optional<double>& value) {
  if (!value) return "";
  std::ostringstream number;
  number << *value;
  const std::string text = number.str();
  const bool integral = text.find_first_of(".en") == std::string::npos;
  return std::string(key) + " = " + text + (integral ? ".0" : "") + "\n";
}

inline std::string keyLine(const char* key, const std::optional<std::string>& value) {
  return value ? std::string(key) + " = \"" + *value + "\"\n" : "";
}

}  // namespace detail

// A job's top-level keys.
struct TopKeys {
  std::optional<std::int64_t> seed;
  std::optional<std::string> devices;
  std::optional<std::string> balance;
};

// The [train] table.
struct TrainKeys {
  std::optional<std::int64_t> steps;
  std::optional<std::int64_t> global_batch;
  std::optional<std::int64_t> micro_batch;
  std::optional<std::int64_t> eval_every;
  std::optional<std::int64_t> eval_samples;
  std::optional<double> target_accuracy;
};

inline std::string trainTable(const TrainKeys& keys) {
  using detail::keyLine;
  return "[train]\n" + keyLine("steps", keys.steps) + keyLine("global_batch", keys.global_batch) +
         keyLine("micro_batch", keys.micro_batch) + keyLine("eval_every", keys.eval_every) +
         keyLine("eval_samples", keys.eval_samples) +
         keyLine("target_accuracy", keys.target_accuracy);
}

// The [optimizer] table.
struct OptimizerKeys {
  std::optional<std::string> name;
  std::optional<double> lr;
  std::optional<double> momentum;
  std::optional<std::int64_t> warmup_steps;
};

inline std::string optimizerTable(const OptimizerKeys& keys) {
  using detail::keyLine;
  return "[optimizer]\n" + keyLine("name", keys.name) + keyLine("lr", keys.lr) +
         keyLine("momentum", keys.momentum) + keyLine("warmup_steps", keys.warmup_steps);
}

// What a job starts with: its top-level keys, then the [train] table.
inline std::string jobStart(const TopKeys& top, const TrainKeys& train) {
  using detail::keyLine;
  return keyLine("seed", top.seed) + keyLine("devices", top.devices) +
         keyLine("balance", top.balance) + trainTable(train);
}

// The [data] table of synthetic samples (of `size` samples when given).
inline std::string syntheticData(std::optional<std::int64_t> size = std::nullopt) {
  return "[data]\ndataset = \"synthetic\"\n" + detail::keyLine("size", size);
}

// An MLP on synthetic samples: the [model] and [data] tables (TOML arrays as written in TOML).
struct MlpKeys {
  std::string input_shape = "[1, 8, 8]";
  std::string hidden;
  std::optional<std::int64_t> size;  // data.size
};

inline std::string mlpOnSynthetic(const MlpKeys& keys) {
  return "[model]\nkind = \"mlp\"\ninput_shape = " + keys.input_shape +
         "\nhidden = " + keys.hidden + "\n" + syntheticData(keys.size);
}

// A GPT on synthetic tokens: the [model] and [data] tables. The defaults are the small GPT of the
// pipeline, ZeRO, precision and equivalence tests (kTinyGpt).
struct GptKeys {
  std::int64_t vocab = 16;
  std::int64_t layers = 2;
  std::int64_t width = 32;
  std::int64_t heads = 2;
  std::int64_t context = 16;
  std::optional<std::int64_t> size = 1024;  // data.size
};

inline std::string gptOnSynthetic(const GptKeys& keys) {
  std::ostringstream out;
  out << "[model]\nkind = \"gpt\"\nvocab = " << keys.vocab << "\nlayers = " << keys.layers
      << "\nwidth = " << keys.width << "\nheads = " << keys.heads << "\ncontext = " << keys.context
      << "\n";
  return out.str() + syntheticData(keys.size);
}

// The small GPT (4 layers: embedding, 2 blocks, head; 16 tokens, width 32) on 1024 synthetic
// sequences: the [model] and [data] tables. A job puts its top-level keys before it and its other
// tables before or after it.
inline const std::string kTinyGpt = gptOnSynthetic({});

// A GPT of 6 layers (embedding, 4 blocks, head), big enough that a micro-batch's compute outweighs
// a transfer's latency: the measured-time pipeline tests.
inline const std::string kSixLayerGpt = gptOnSynthetic(
    {.vocab = 32, .layers = 4, .width = 64, .heads = 4, .context = 32, .size = 2048});

}  // namespace chorus::runtime::testing
