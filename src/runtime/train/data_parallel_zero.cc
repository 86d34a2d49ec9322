// ZeRO's part of a data-parallel checkpoint. Each rank writes the optimizer state of its own
// slice ("zero/<name>" in rank-<r>.pt) and rank 0 the whole model; trainer.json records the
// slices' bounds. A resume puts the slices of every writer together in flat order and cuts the
// slice of its own rank out of them, so the shard layout and the world size may change between
// the two (3 ranks to 2, "even" to "memory").
#include <ATen/ATen.h>
#include <torch/serialize.h>

#include "checkpoint/checkpoint_archive.h"
#include "chorus/core/error.h"
#include "train/data_parallel_engine.h"

namespace chorus::runtime {
namespace {

constexpr const char* kPrefix = "zero/";

std::string rankFile(int rank) { return "rank-" + std::to_string(rank) + ".pt"; }

std::string describeZero(const nlohmann::json& entry) {
  return entry.is_null() ? "no ZeRO" : "ZeRO stage " + entry.at("stage").dump();
}

}  // namespace

void writeZeroSlice(const DataParallelEngine& engine, torch::serialize::OutputArchive& archive) {
  for (const auto& [name, tensor] : engine.zero->sliceState())
    archive.write(kPrefix + name, tensor);
}

nlohmann::json zeroEntry(const DataParallelEngine& engine) {
  return {{"stage", engine.zero->stage()}, {"bounds", engine.zero->bounds()}};
}

void restoreZero(DataParallelEngine& engine, const CheckpointSource& source) {
  const nlohmann::json saved = source.saved.value("zero", nlohmann::json());
  if (saved.is_null())
    source.mismatch("the optimizer's layout", describeZero(saved),
                    describeZero(zeroEntry(engine)) +
                        " (a sharded optimizer resumes from a "
                        "ZeRO checkpoint)");
  const auto bounds = saved.at("bounds").get<std::vector<std::int64_t>>();
  if (bounds.empty() || bounds.back() != engine.zero->bounds().back())
    source.mismatch("the number of parameters", std::to_string(bounds.empty() ? 0 : bounds.back()),
                    std::to_string(engine.zero->bounds().back()));
  // Every writer's slice, in rank order, is one piece of each whole flat state.
  std::map<std::string, std::vector<at::Tensor>> pieces;
  std::map<std::string, at::Tensor> whole;
  for (size_t rank = 0; rank + 1 < bounds.size(); ++rank) {
    auto archive = archiveOf(source.read(rankFile(static_cast<int>(rank))));
    for (const std::string& key : archive.keys()) {
      if (key.rfind(kPrefix, 0) != 0) continue;
      at::Tensor value;
      archive.read(key, value);
      const std::string name = key.substr(std::string(kPrefix).size());
      if (name == "step") {
        whole[name] = value;
        continue;
      }
      if (value.numel() != bounds[rank + 1] - bounds[rank])
        CHORUS_THROW(CheckpointError, "checkpoint '", source.dir, "': rank ", rank, "'s '", name,
                     "' holds ", value.numel(), " elements, its slice ",
                     bounds[rank + 1] - bounds[rank]);
      pieces[name].push_back(value.reshape({-1}));
    }
  }
  for (auto& [name, parts] : pieces) {
    if (parts.size() + 1 != bounds.size())
      CHORUS_THROW(CheckpointError, "checkpoint '", source.dir, "': '", name, "' is saved by ",
                   parts.size(), " of ", bounds.size() - 1, " ranks");
    whole[name] = at::cat(parts);
  }
  engine.zero->loadWholeState(whole);
  engine.zero->loadMasterFromParameters();  // the model was loaded before (restore())
}

}  // namespace chorus::runtime
