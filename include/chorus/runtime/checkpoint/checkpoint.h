// Checkpoints on disk: a directory per checkpoint, written atomically by all ranks together, with
// a manifest that holds a SHA-256 per file.
//
//   <root>/step-00000120/        one complete checkpoint
//       MANIFEST.json            written last: step, world size, {name, bytes, sha256} per file
//       model.pt optimizer.pt trainer.json     shared state (rank 0)
//       rank-0.pt rank-1.pt ...                per-rank state (RNG, loss scaler)
//   <root>/latest                the name of the newest complete checkpoint (replaced atomically)
//   <root>/.staging-step-00000120             a checkpoint being written
//
// Publishing is crash-safe: every file is fsync'ed, then the manifest, then the staging directory
// is renamed to its final name and the root fsync'ed, and only then is `latest` replaced (temp
// file, fsync, rename, fsync of the root). A crash at any point leaves `latest` naming a complete
// checkpoint, and a half-written one stays under a .staging name that lookups ignore. Readers check
// every file against the manifest, so a flipped byte or a truncated file is found and named.
// The root must be one directory that every rank can reach (one node, or a shared file system).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace chorus::comm {
class Store;
}

namespace chorus::runtime {

// One file of a checkpoint. Value type.
struct CheckpointFile {
  std::string name;   // relative to the checkpoint directory, no '/'
  std::string bytes;  // the contents
};

struct ManifestEntry {
  std::string name;
  std::uint64_t bytes = 0;
  std::string sha256;  // lowercase hex
};

// Value type.
struct Manifest {
  int format = 1;
  std::int64_t step = 0;  // the step the job resumes at
  int world_size = 0;
  std::vector<ManifestEntry> files;
  const ManifestEntry* find(const std::string& name) const;
};

struct CheckpointOptions {
  // Root directory of the job's checkpoints. Required.
  std::string root;
  // Complete checkpoints to keep; older ones are removed after a new one is published. Default: 3.
  int keep = 3;
  // Deadline for the ranks to hand in their files. Default: 10 min (a slow disk, a big model).
  std::chrono::milliseconds timeout{600000};
  // Test hook: called after each file is written and fsync'ed, with its path (fault tests kill
  // the process here). Default: none.
  std::function<void(const std::string& path)> after_file;
  // Polled (from the writing thread) while a write waits for the other ranks: true gives the
  // write up with CommError within kCancelPoll. Elastic jobs pass "this generation's world was
  // aborted", so that a write a lost rank can never complete ends with its generation instead of
  // at `timeout`, and frees the store connection it waits on. Default: none (never given up).
  std::function<bool()> cancelled;
};

// How often CheckpointOptions::cancelled is polled while a write waits.
constexpr std::chrono::milliseconds kCancelPoll{20};

// "step-00000120".
std::string checkpointName(std::int64_t step);

// Writes the checkpoints of one rank. Ranks coordinate through the job's store: rank 0 prepares
// the staging directory, every rank writes its files and hands in their checksums, rank 0 writes
// the manifest and publishes. Thread-safe for one write() at a time per rank; may run on a
// background thread (it uses only the store, never the communicator). Non-copyable.
class CheckpointWriter {
 public:
  CheckpointWriter(CheckpointOptions options, std::shared_ptr<comm::Store> store, int rank,
                   int world_size);
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Writes this rank's `files` of the checkpoint at `step` (every rank calls it for the same
  // steps, in the same order) and returns once the checkpoint is published. Returns its path.
  // Throws CheckpointError (I/O) or TimeoutError (a rank never handed in its files).
  std::string write(std::int64_t step, const std::vector<CheckpointFile>& files);

  const CheckpointOptions& options() const { return options_; }

 private:
  void publish(std::int64_t step, const std::string& staging, const std::string& final_dir);
  // store_->wait(keys) within options_.timeout, giving up when options_.cancelled says so.
  void awaitKeys(const std::vector<std::string>& keys);

  CheckpointOptions options_;
  std::shared_ptr<comm::Store> store_;
  int rank_;
  int world_size_;
};

// Reads and checks a checkpoint directory's manifest. Throws CheckpointError.
Manifest readManifest(const std::string& checkpoint_dir);
// The contents of `name`, checked against the manifest (size and SHA-256). Throws CheckpointError
// naming the file when it is missing, truncated or corrupted.
std::string readCheckpointFile(const std::string& checkpoint_dir, const Manifest& manifest,
                               const std::string& name);
// Checks every file of a checkpoint. Throws CheckpointError naming the first bad file.
void verifyCheckpoint(const std::string& checkpoint_dir);
// The whole model of a data-parallel checkpoint as one libtorch archive (one tensor per dotted
// parameter name, as model.pt holds it), written to `out`: a ZeRO-3 checkpoint's parameter slices
// put together (every rank file's "zero/parameters" in the flat order trainer.json records), or
// another checkpoint's model.pt, checked and copied. Needs nothing but the checkpoint (no data,
// no config). Returns the number of parameters (tensors) written. Throws CheckpointError when the
// checkpoint is damaged or holds no whole data-parallel model (a pipeline's, local SGD's).
std::int64_t consolidateCheckpoint(const std::string& checkpoint_dir, const std::string& out);
// The same for a checkpoint of the Python front: one file that chorus.save wrote, with its
// SHA-256 in `file`.sha256 (python/chorus/checkpoint.py). Its "model" entry (the state dict's
// tensors by name, gathered whole under ZeRO) is written to `out` as consolidateCheckpoint writes
// model.pt; state dict entries that are no tensor libtorch reads are left out, with a warning.
// Returns the number of tensors written. Throws CheckpointError when the checksum is missing or
// does not match, when the file is damaged or forged, of another format or of the layout before
// this one (which libtorch cannot read: chorus.load still reads it), or holds no model.
std::int64_t consolidatePythonCheckpoint(const std::string& file, const std::string& out);
// Whether `path` names a checkpoint file, as chorus.save writes (a regular file), rather than a
// checkpoint directory or root.
bool isPythonCheckpointFile(const std::string& path);
// Complete checkpoints under `root` (names step-*), newest first.
std::vector<std::string> listCheckpoints(const std::string& root);
// What `--resume WHAT` means: "latest" → the checkpoint `root`/latest names, or, when that is
// missing or damaged, the newest checkpoint under `root` that verifies (with a warning); a
// directory holding a MANIFEST.json → that checkpoint (verified); any other directory → its
// latest. Throws CheckpointError when nothing valid is found, naming what was wrong.
std::string resolveCheckpoint(const std::string& what, const std::string& root);

}  // namespace chorus::runtime
