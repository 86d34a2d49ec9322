// The global sampler: which sample ids form the global batch of each training step.
//
// Every rank builds the same GlobalSampler from the job config and asks it for the ids of the
// current step; sharding.h then gives each rank its slice. The batch sequence is a pure function of
// (dataset size, global batch, seed, shuffle): it never depends on the world size, the devices or
// the shares, which is what lets heterogeneous training match single-device training step for step
// (invariant 1), and lets a resumed job continue the same sequence from a checkpointed step.
//
// Epochs: an epoch is floor(N / B) batches, read in order from a permutation of 0 .. N-1 that is a
// pure function of (seed, epoch); the last N mod B ids of each permutation are dropped, so every
// batch is full. The permutation is a Fisher-Yates shuffle driven by SplitMix64 (random.h), the
// same on every platform. Torch-free.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace chorus::data {

// Where a step lies in the epoch structure, as saved in checkpoints.
struct SamplerState {
  // The epoch of the step, from 0.
  std::int64_t epoch = 0;
  // Index, in the epoch's permutation, of the step's first sample (a multiple of the global batch).
  std::int64_t position = 0;
  // The global step, from 0.
  std::int64_t step = 0;
};

// Options of a GlobalSampler.
struct SamplerOptions {
  // Number of samples in the dataset (N). REQUIRES: >= global_batch.
  std::int64_t dataset_size = 0;
  // Samples per global step, summed over all ranks (B). REQUIRES: >= 1.
  std::int64_t global_batch = 0;
  // Seed of the per-epoch permutations. Default: 0.
  std::uint64_t seed = 0;
  // Shuffle each epoch; false reads 0 .. N-1 in order every epoch. Default: true.
  bool shuffle = true;
};

// Maps global steps to global batches.
//
// Thread-safety: all methods are const and safe to call concurrently; batch() caches the most
// recent epoch's permutation behind a mutex (rebuilding it costs O(N)). Not copyable.
class GlobalSampler {
 public:
  // Throws ConfigError when global_batch < 1, dataset_size < global_batch.
  explicit GlobalSampler(const SamplerOptions& options);
  GlobalSampler(std::int64_t dataset_size, std::int64_t global_batch, std::uint64_t seed,
                bool shuffle = true);
  GlobalSampler(const GlobalSampler&) = delete;
  GlobalSampler& operator=(const GlobalSampler&) = delete;
  ~GlobalSampler();

  // The global_batch sample ids of global step `step` (>= 0), in order. The same for the same
  // step whatever was called before. Throws ConfigError for a negative step.
  std::vector<std::int64_t> batch(std::int64_t step) const;

  // floor(N / B): the steps in one epoch.
  std::int64_t batchesPerEpoch() const { return batches_per_epoch_; }
  // The epoch that `step` belongs to.
  std::int64_t epochOf(std::int64_t step) const;
  // The epoch and position of `step`, for a checkpoint.
  SamplerState state(std::int64_t step) const;
  // The step to continue from after a saved state, i.e. state.step once the state is checked
  // against this sampler. Throws ConfigError when the state cannot come from a sampler of the same
  // dataset size and global batch (e.g. a checkpoint of another config).
  std::int64_t resume(const SamplerState& state) const;

  // The permutation of epoch `epoch`: all N ids, of which the first batchesPerEpoch() * B are used.
  std::vector<std::int64_t> permutation(std::int64_t epoch) const;

  const SamplerOptions& options() const { return options_; }

 private:
  struct Cache;

  SamplerOptions options_;
  std::int64_t batches_per_epoch_;
  mutable std::mutex mutex_;
  // The permutation of the epoch last used by batch(); guarded by mutex_.
  mutable std::shared_ptr<const Cache> cache_;
};

}  // namespace chorus::data
