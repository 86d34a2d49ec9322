// `chorus checkpoint consolidate`: one model.pt from a checkpoint, whatever wrote it. A ZeRO-3
// checkpoint has no model file: every rank file holds its slice of the flattened parameters
// ("zero/parameters"), and trainer.json the slices' bounds, the flat order, and each parameter's
// name and shape, so the whole model is put together from the checkpoint alone. A pipeline's
// stages each hold their layers under the whole model's names: the first replica's are joined.
#include <ATen/ATen.h>
#include <torch/serialize.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_archive.h"
#include "chorus/core/error.h"
#include "chorus/runtime/checkpoint/checkpoint.h"

namespace chorus::runtime {
namespace {

constexpr const char* kModelFile = "model.pt";

void writeFile(const std::string& path, const std::string& bytes) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file || !file.write(bytes.data(), static_cast<std::streamsize>(bytes.size())) ||
      !file.flush())
    CHORUS_THROW(CheckpointError, "cannot write '", path, "'");
}

// The parameters of a ZeRO-3 checkpoint, by name in the model's order.
std::vector<std::pair<std::string, at::Tensor>> zeroParameters(const std::string& dir,
                                                               const Manifest& manifest,
                                                               const nlohmann::json& zero) {
  const auto bounds = zero.at("bounds").get<std::vector<std::int64_t>>();
  const auto order = zero.at("order").get<std::vector<int>>();
  const auto names = zero.at("names").get<std::vector<std::string>>();
  const auto shapes = zero.at("shapes").get<std::vector<std::vector<std::int64_t>>>();
  const auto damaged = [&](const std::string& what) {
    CHORUS_THROW(CheckpointError, "checkpoint '", dir, "' is damaged: ", what);
  };
  if (bounds.size() < 2 || names.size() != shapes.size() || order.size() != names.size())
    damaged("its ZeRO entry does not describe the parameters' slices");
  std::vector<at::Tensor> slices;
  for (size_t rank = 0; rank + 1 < bounds.size(); ++rank) {
    auto archive = archiveOf(readCheckpointFile(dir, manifest, rankFile(static_cast<int>(rank))));
    at::Tensor slice;
    if (!archive.try_read("zero/parameters", slice))
      damaged("rank " + std::to_string(rank) + "'s file holds no parameter slice");
    if (slice.numel() != bounds[rank + 1] - bounds[rank])
      damaged("rank " + std::to_string(rank) + "'s parameter slice has " +
              std::to_string(slice.numel()) + " elements, its bounds " +
              std::to_string(bounds[rank + 1] - bounds[rank]));
    slices.push_back(slice.reshape({-1}));
  }
  const at::Tensor whole = at::cat(slices);
  std::vector<std::pair<std::string, at::Tensor>> parameters(names.size());
  std::int64_t position = 0;
  for (int index : order) {
    if (index < 0 || index >= static_cast<int>(names.size()) || parameters[index].second.defined())
      damaged("its flat order is not a permutation of the parameters");
    const at::Tensor value = at::empty(shapes[index], at::kFloat);
    if (position + value.numel() > whole.numel()) damaged("the slices hold too few elements");
    value.view({-1}).copy_(whole.narrow(0, position, value.numel()));
    position += value.numel();
    parameters[index] = {names[index], value};
  }
  if (position != whole.numel()) damaged("the slices hold more elements than the parameters");
  return parameters;
}

// The tensors of a pipeline checkpoint's stages (of its first replica) into `archive`.
std::int64_t pipelineTensors(const std::string& dir, const Manifest& manifest,
                             const nlohmann::json& pipeline,
                             torch::serialize::OutputArchive& archive) {
  std::int64_t count = 0;
  const int stages = pipeline.at("stages").get<int>();
  for (int stage = 0; stage < stages; ++stage) {
    const std::string name = "stage-" + std::to_string(stage) + "-replica-0-model.pt";
    auto stage_archive = archiveOf(readCheckpointFile(dir, manifest, name));
    for (const std::string& key : stage_archive.keys()) {
      at::Tensor value;
      stage_archive.read(key, value);
      archive.write(key, value);
      ++count;
    }
  }
  return count;
}

}  // namespace

std::int64_t consolidateCheckpoint(const std::string& dir, const std::string& out) {
  const Manifest manifest = readManifest(dir);
  const nlohmann::json saved =
      nlohmann::json::parse(readCheckpointFile(dir, manifest, "trainer.json"));
  if (manifest.find(kModelFile) != nullptr) {
    const std::string bytes = readCheckpointFile(dir, manifest, kModelFile);
    const auto keys = archiveOf(bytes).keys();
    writeFile(out, bytes);
    return static_cast<std::int64_t>(keys.size());
  }
  torch::serialize::OutputArchive archive;
  if (saved.contains("pipeline")) {
    const std::int64_t count = pipelineTensors(dir, manifest, saved.at("pipeline"), archive);
    writeFile(out, archiveBytes(archive));
    return count;
  }
  if (!saved.contains("zero") || saved.at("zero").value("stage", 0) < 3)
    CHORUS_THROW(CheckpointError, "checkpoint '", dir,
                 "' holds no whole model to consolidate (no model.pt, and no ZeRO-3 slices; local "
                 "SGD's ranks are saved apart)");
  const auto parameters = zeroParameters(dir, manifest, saved.at("zero"));
  for (const auto& [name, value] : parameters) archive.write(name, value);
  writeFile(out, archiveBytes(archive));
  return static_cast<std::int64_t>(parameters.size());
}

}  // namespace chorus::runtime
