// Writing a checkpoint together: staging, hand-in of checksums through the store, publishing.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_files.h"
#include "chorus/comm/store/store.h"
#include "chorus/core/clock.h"
#include "chorus/core/error.h"
#include "chorus/core/logging.h"
#include "chorus/runtime/checkpoint/checkpoint.h"

namespace chorus::runtime {
namespace fs = std::filesystem;
namespace {

std::string storePrefix(const std::string& name) { return "chorus/checkpoint/" + name + "/"; }

nlohmann::json entriesToJson(const std::vector<ManifestEntry>& entries) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& entry : entries)
    list.push_back({{"name", entry.name}, {"bytes", entry.bytes}, {"sha256", entry.sha256}});
  return list;
}

std::vector<ManifestEntry> entriesFromJson(const nlohmann::json& list) {
  std::vector<ManifestEntry> entries;
  for (const auto& item : list)
    entries.push_back({item.at("name").get<std::string>(), item.at("bytes").get<std::uint64_t>(),
                       item.at("sha256").get<std::string>()});
  return entries;
}

void checkFileName(const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos || name == "MANIFEST.json" ||
      name[0] == '.')
    CHORUS_THROW(CheckpointError, "invalid checkpoint file name '", name, "'");
}

// Removes complete checkpoints beyond the newest `keep`, and staging directories of older steps
// (left by a crash while writing).
void prune(const std::string& root, int keep, std::int64_t step) {
  const std::vector<std::string> complete = listCheckpoints(root);
  for (size_t i = static_cast<size_t>(std::max(keep, 1)); i < complete.size(); ++i) {
    std::error_code error;
    fs::remove_all(fs::path(root) / complete[i], error);
    if (error) logWarn("checkpoint: cannot remove old '", complete[i], "': ", error.message());
  }
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    const std::string prefix = ".staging-step-";
    if (name.rfind(prefix, 0) != 0) continue;
    std::int64_t staged = -1;
    try {
      staged = std::stoll(name.substr(prefix.size()));
    } catch (...) {
      continue;
    }
    std::error_code error;
    if (staged < step) fs::remove_all(entry.path(), error);
  }
}

}  // namespace

std::string checkpointName(std::int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return name;
}

CheckpointWriter::CheckpointWriter(CheckpointOptions options, std::shared_ptr<comm::Store> store,
                                   int rank, int world_size)
    : options_(std::move(options)), store_(std::move(store)), rank_(rank), world_size_(world_size) {
  CHORUS_CHECK_CONFIG(!options_.root.empty(), "checkpoint: no directory given (checkpoint.dir)");
  CHORUS_CHECK_CONFIG(options_.keep >= 1, "checkpoint: keep must be at least 1");
}

void CheckpointWriter::awaitKeys(const std::vector<std::string>& keys) {
  if (!options_.cancelled) {
    store_->wait(keys, options_.timeout);
    return;
  }
  // In slices, so that a cancellation is seen; the store connection is free between them.
  const Deadline deadline = Deadline::after(options_.timeout);
  for (;;) {
    if (options_.cancelled())
      CHORUS_THROW(CommError, "checkpoint: given up while waiting for the other ranks (",
                   keys.front(), "): the job's membership changed");
    try {
      // At least 1 ms: a timeout of 0 may mean "no deadline" to a store.
      store_->wait(keys, std::max(std::chrono::milliseconds(1),
                                  std::min(kCancelPoll, deadline.remaining())));
      return;
    } catch (const TimeoutError&) {
      if (deadline.expired()) throw;
    }
  }
}

std::string CheckpointWriter::write(std::int64_t step, const std::vector<CheckpointFile>& files) {
  const std::string name = checkpointName(step);
  const std::string prefix = storePrefix(name);
  const std::string staging = (fs::path(options_.root) / (".staging-" + name)).string();
  const std::string final_dir = (fs::path(options_.root) / name).string();
  if (rank_ == 0) {
    std::error_code error;
    fs::create_directories(options_.root, error);
    if (error)
      CHORUS_THROW(CheckpointError, "cannot create checkpoint directory '", options_.root,
                   "': ", error.message());
    fs::remove_all(staging, error);
    fs::create_directories(staging, error);
    if (error) CHORUS_THROW(CheckpointError, "cannot create '", staging, "': ", error.message());
    store_->setString(prefix + "ready", "1");
  } else {
    awaitKeys({prefix + "ready"});
  }
  std::vector<ManifestEntry> entries;
  for (const CheckpointFile& file : files) {
    checkFileName(file.name);
    const std::string path = (fs::path(staging) / file.name).string();
    writeFileDurably(path, file.bytes);
    entries.push_back({file.name, file.bytes.size(), sha256Hex(file.bytes)});
    if (options_.after_file) options_.after_file(path);
  }
  store_->setString(prefix + "rank" + std::to_string(rank_), entriesToJson(entries).dump());
  if (rank_ == 0) {
    publish(step, staging, final_dir);
    store_->setString(prefix + "done", final_dir);
  } else {
    awaitKeys({prefix + "done"});
  }
  return final_dir;
}

void CheckpointWriter::publish(std::int64_t step, const std::string& staging,
                               const std::string& final_dir) {
  const std::string prefix = storePrefix(checkpointName(step));
  std::vector<std::string> keys;
  for (int rank = 0; rank < world_size_; ++rank)
    keys.push_back(prefix + "rank" + std::to_string(rank));
  awaitKeys(keys);
  nlohmann::json manifest = {{"format", 1}, {"step", step}, {"world_size", world_size_}};
  std::vector<ManifestEntry> all;
  for (const auto& key : keys) {
    for (auto& entry :
         entriesFromJson(nlohmann::json::parse(store_->getString(key, options_.timeout)))) {
      for (const auto& seen : all)
        if (seen.name == entry.name)
          CHORUS_THROW(CheckpointError, "checkpoint file '", entry.name, "' written by two ranks");
      all.push_back(std::move(entry));
    }
  }
  manifest["files"] = entriesToJson(all);
  writeFileDurably((fs::path(staging) / "MANIFEST.json").string(), manifest.dump(2) + "\n");
  if (options_.after_file) options_.after_file((fs::path(staging) / "MANIFEST.json").string());
  fsyncDirectory(staging);
  std::error_code error;
  fs::remove_all(final_dir, error);  // an older run's checkpoint of the same step
  fs::rename(staging, final_dir, error);
  if (error)
    CHORUS_THROW(CheckpointError, "cannot publish checkpoint '", final_dir, "': ", error.message());
  fsyncDirectory(options_.root);
  replaceFileAtomically((fs::path(options_.root) / "latest").string(), checkpointName(step) + "\n");
  prune(options_.root, options_.keep, step);
}

}  // namespace chorus::runtime
