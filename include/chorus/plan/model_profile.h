// Model cost profiles: what the planner needs to know about a model, per layer.
//
// A ModelProfile is a sequence of layers (pipeline stages cut between them), each with its
// parameter count, forward FLOPs per sample, the activation bytes it keeps for the backward pass
// per sample, and the bytes of its output per sample (what a stage boundary sends, and what
// activation checkpointing keeps). Profiles come from named transformer shapes
// (transformer_shapes.h), or as JSON from the torch `model` layer, which measures or derives them
// for the zoo models; the planner never links the model layer.
//
// JSON form (`repeat` expands one entry into that many identical layers; Default: 1;
// `workspace_bytes` and the model's `input_bytes` and `target_bytes` Default: 0):
//   {"name": "gpt-small", "activation_element_bytes": 4,
//    "layers": [{"name": "embed", "params": 1.6e6, "forward_flops": 0,
//                "activation_bytes": 65536, "output_bytes": 65536},
//               {"name": "block", "repeat": 12, ...}]}
#pragma once

#include <string>
#include <vector>

namespace chorus::plan {

// One layer. Value type; figures are per sample and may be fractional (averages).
struct LayerProfile {
  std::string name;
  double params = 0;
  // FLOPs of the forward pass for one sample; backward costs twice this.
  double forward_flops = 0;
  // Bytes kept for the backward pass per sample, at the profile's activation_element_bytes.
  double activation_bytes = 0;
  // Bytes of the layer's output per sample, at the profile's activation_element_bytes.
  double output_bytes = 0;
  // Bytes per sample the layer's backward pass allocates for a moment above what it keeps: the
  // gradient of its output and of its intermediates (memory_model.h). Optional in JSON.
  double workspace_bytes = 0;
};

// A model as the planner sees it. Value type.
struct ModelProfile {
  std::string name;
  std::vector<LayerProfile> layers;
  // Bytes per element at which activation_bytes and output_bytes were taken; the cost model
  // scales them to each rank's precision. Default: 2 (16-bit training).
  int activation_element_bytes = 2;
  // Bytes of one sample's input and of its target as the data loader hands them over (the first
  // stage holds inputs, the last targets); optional in JSON. Default: 0.
  double input_bytes = 0;
  double target_bytes = 0;

  int layerCount() const { return static_cast<int>(layers.size()); }
  double totalParams() const;
  double totalForwardFlops() const;
  // Throws ConfigError unless there is at least one layer and every figure is finite and >= 0.
  void validate() const;
};

// Parses the JSON form. `source` names the text in errors, which give the line and the key:
// "model.json:7: layers[1] ('block'): 'params' must be a number >= 0".
ModelProfile parseModelJson(const std::string& text, const std::string& source);

// Reads and parses a JSON profile file.
ModelProfile loadModelFile(const std::string& path);

// The JSON form of a profile (one entry per layer, no `repeat`).
std::string modelToJson(const ModelProfile& model);

}  // namespace chorus::plan
