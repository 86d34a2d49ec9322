// Pieces of job TOML that several runtime tests train on, kept in one place so that a test's own
// job shows only what it changes.
#pragma once

namespace chorus::runtime::testing {

// The small GPT of the pipeline, ZeRO, precision and equivalence tests (4 layers: embedding, 2
// blocks, head; 16 tokens, width 32) on synthetic tokens: the [model] and [data] tables. A job
// puts its top-level keys before it and its other tables before or after it.
inline constexpr const char* kTinyGpt = R"([model]
kind = "gpt"
vocab = 16
layers = 2
width = 32
heads = 2
context = 16
[data]
dataset = "synthetic"
size = 1024
)";

}  // namespace chorus::runtime::testing
