// Reading checkpoints: manifests, checked files, and what `--resume` points at.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <type_traits>

#include "checkpoint/checkpoint_files.h"
#include "chorus/core/error.h"
#include "chorus/core/logging.h"
#include "chorus/runtime/checkpoint/checkpoint.h"

namespace chorus::runtime {
namespace fs = std::filesystem;
namespace {

// The step of a directory named step-NNNNNNNN, or -1.
std::int64_t stepOfName(const std::string& name) {
  // More digits than an int64 holds is no checkpoint of ours (and std::stoll would throw).
  if (name.rfind("step-", 0) != 0 || name.size() <= 5 || name.size() > 5 + 18) return -1;
  for (size_t i = 5; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return -1;
  return std::stoll(name.substr(5));
}

// An integer field of a manifest, in Int's range. nlohmann reads a number past int64 as a
// double and get<int>() casts it, undefined behaviour out of range (a fuzz finding: world_size =
// 1111111111111111111111111112): such a field is damage, like any other.
template <typename Int>
Int integerField(const nlohmann::json& json, const char* key, const std::string& checkpoint_dir) {
  const nlohmann::json& value = json.at(key);
  const bool fits = value.is_number_unsigned()
                        ? value.get<std::uint64_t>() <=
                              static_cast<std::uint64_t>(std::numeric_limits<Int>::max())
                        : value.is_number_integer() &&
                              value.get<std::int64_t>() >=
                                  static_cast<std::int64_t>(std::numeric_limits<Int>::min()) &&
                              (std::is_unsigned_v<Int> ||
                               value.get<std::int64_t>() <=
                                   static_cast<std::int64_t>(std::numeric_limits<Int>::max()));
  if (!fits)
    CHORUS_THROW(CheckpointError, "checkpoint '", checkpoint_dir, "': MANIFEST.json is damaged: '",
                 key, "' is ", value.dump(), ", not an integer in range");
  return value.get<Int>();
}

std::string trimmed(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

}  // namespace

const ManifestEntry* Manifest::find(const std::string& name) const {
  for (const auto& entry : files)
    if (entry.name == name) return &entry;
  return nullptr;
}

Manifest readManifest(const std::string& checkpoint_dir) {
  const std::string path = (fs::path(checkpoint_dir) / "MANIFEST.json").string();
  if (!fs::exists(path))
    CHORUS_THROW(CheckpointError, "checkpoint '", checkpoint_dir,
                 "' has no MANIFEST.json (incomplete or not a checkpoint)");
  Manifest manifest;
  try {
    const auto json = nlohmann::json::parse(readWholeFile(path));
    manifest.format = integerField<int>(json, "format", checkpoint_dir);
    manifest.step = integerField<std::int64_t>(json, "step", checkpoint_dir);
    manifest.world_size = integerField<int>(json, "world_size", checkpoint_dir);
    for (const auto& item : json.at("files"))
      manifest.files.push_back({item.at("name").get<std::string>(),
                                integerField<std::uint64_t>(item, "bytes", checkpoint_dir),
                                item.at("sha256").get<std::string>()});
  } catch (const nlohmann::json::exception& error) {
    CHORUS_THROW(CheckpointError, "checkpoint '", checkpoint_dir,
                 "': MANIFEST.json is damaged: ", error.what());
  }
  if (manifest.format != 1)
    CHORUS_THROW(CheckpointError, "checkpoint '", checkpoint_dir, "': format ", manifest.format,
                 " is not supported (this chorus reads format 1)");
  if (manifest.step < 0 || manifest.world_size < 1)
    CHORUS_THROW(CheckpointError, "checkpoint '", checkpoint_dir,
                 "': MANIFEST.json is damaged: step ", manifest.step, ", world size ",
                 manifest.world_size);
  // The writer names files within the checkpoint; a name that leaves it (or is not a file name)
  // would make readers open some other file.
  for (const auto& entry : manifest.files)
    if (entry.name.empty() || entry.name == "." || entry.name == ".." ||
        entry.name.find('/') != std::string::npos)
      CHORUS_THROW(CheckpointError, "checkpoint '", checkpoint_dir,
                   "': MANIFEST.json names a file '", entry.name,
                   "' outside the checkpoint directory");
  return manifest;
}

std::string readCheckpointFile(const std::string& checkpoint_dir, const Manifest& manifest,
                               const std::string& name) {
  const ManifestEntry* entry = manifest.find(name);
  if (!entry)
    CHORUS_THROW(CheckpointError, "checkpoint '", checkpoint_dir, "' has no file '", name, "'");
  const std::string path = (fs::path(checkpoint_dir) / name).string();
  if (!fs::exists(path)) CHORUS_THROW(CheckpointError, "checkpoint file '", path, "' is missing");
  std::string bytes = readWholeFile(path);
  if (bytes.size() != entry->bytes)
    CHORUS_THROW(CheckpointError, "checkpoint file '", path,
                 "' is truncated or damaged: ", bytes.size(), " bytes, the manifest says ",
                 entry->bytes);
  if (sha256Hex(bytes) != entry->sha256)
    CHORUS_THROW(CheckpointError, "checkpoint file '", path,
                 "' is corrupted: its SHA-256 does not match the manifest");
  return bytes;
}

void verifyCheckpoint(const std::string& checkpoint_dir) {
  const Manifest manifest = readManifest(checkpoint_dir);
  for (const auto& entry : manifest.files) readCheckpointFile(checkpoint_dir, manifest, entry.name);
}

std::vector<std::string> listCheckpoints(const std::string& root) {
  std::vector<std::pair<std::int64_t, std::string>> found;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(root, error)) {
    const std::string name = entry.path().filename().string();
    const std::int64_t step = stepOfName(name);
    if (step >= 0 && entry.is_directory()) found.emplace_back(step, name);
  }
  std::sort(found.rbegin(), found.rend());
  std::vector<std::string> names;
  for (auto& [step, name] : found) names.push_back(std::move(name));
  return names;
}

std::string resolveCheckpoint(const std::string& what, const std::string& root) {
  if (what != "latest") {
    if (fs::exists(fs::path(what) / "MANIFEST.json")) {
      verifyCheckpoint(what);
      return what;
    }
    if (fs::is_directory(what)) return resolveCheckpoint("latest", what);
    CHORUS_THROW(CheckpointError, "cannot resume from '", what,
                 "': neither a checkpoint nor a checkpoint directory");
  }
  if (root.empty())
    CHORUS_THROW(CheckpointError, "--resume latest needs checkpoint.dir in the config");
  std::ostringstream reasons;
  std::string named;
  const fs::path latest = fs::path(root) / "latest";
  if (fs::exists(latest)) {
    named = trimmed(readWholeFile(latest.string()));
    const std::string dir = (fs::path(root) / named).string();
    try {
      verifyCheckpoint(dir);
      return dir;
    } catch (const CheckpointError& error) {
      logWarn("checkpoint: 'latest' names a damaged checkpoint (", error.what(),
              "); looking for an older one");
      reasons << "\n  " << error.what();
    }
  }
  for (const std::string& name : listCheckpoints(root)) {
    if (name == named) continue;
    const std::string dir = (fs::path(root) / name).string();
    try {
      verifyCheckpoint(dir);
      if (!named.empty()) logWarn("checkpoint: resuming from ", dir, " instead");
      return dir;
    } catch (const CheckpointError& error) {
      reasons << "\n  " << error.what();
    }
  }
  CHORUS_THROW(CheckpointError, "no valid checkpoint under '", root, "'", reasons.str());
}

}  // namespace chorus::runtime
