// A checkpoint's model as tensors by dotted name, for tests that compare runs: its model.pt, or
// for a ZeRO-3 checkpoint (which has none) the model consolidated from its slices next to it.
#pragma once

#include <torch/serialize.h>
#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <string>

#include "chorus/runtime/checkpoint/checkpoint.h"

namespace chorus::testing {

// Every tensor of a module archive (submodules are nested archives), by dotted name.
inline void collectTensors(torch::serialize::InputArchive& archive, const std::string& prefix,
                           std::map<std::string, at::Tensor>& tensors) {
  for (const auto& key : archive.keys()) {
    at::Tensor value;
    torch::serialize::InputArchive nested;
    if (archive.try_read(key, value))
      tensors[prefix + key] = value;
    else if (archive.try_read(key, nested))
      collectTensors(nested, prefix + key + ".", tensors);
  }
}

inline std::map<std::string, at::Tensor> checkpointModel(const std::string& checkpoint) {
  std::string file = checkpoint + "/model.pt";
  if (!std::filesystem::exists(file)) {
    file = checkpoint + ".consolidated.pt";
    runtime::consolidateCheckpoint(checkpoint, file);
  }
  torch::serialize::InputArchive archive;
  archive.load_from(file);
  std::map<std::string, at::Tensor> tensors;
  collectTensors(archive, "", tensors);
  return tensors;
}

}  // namespace chorus::testing
