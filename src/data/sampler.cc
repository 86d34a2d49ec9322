#include "chorus/data/sampler.h"

#include <numeric>
#include <utility>

#include "chorus/core/error.h"
#include "chorus/data/random.h"

namespace chorus::data {

struct GlobalSampler::Cache {
  std::int64_t epoch;
  std::vector<std::int64_t> ids;
};

GlobalSampler::GlobalSampler(const SamplerOptions& options) : options_(options) {
  CHORUS_CHECK_CONFIG(options.global_batch >= 1, "the global batch must be at least 1, got ",
                      options.global_batch);
  CHORUS_CHECK_CONFIG(options.dataset_size >= options.global_batch, "the global batch (",
                      options.global_batch, ") is larger than the dataset (", options.dataset_size,
                      " samples)");
  batches_per_epoch_ = options.dataset_size / options.global_batch;
}

GlobalSampler::GlobalSampler(std::int64_t dataset_size, std::int64_t global_batch,
                             std::uint64_t seed, bool shuffle)
    : GlobalSampler(SamplerOptions{dataset_size, global_batch, seed, shuffle}) {}

GlobalSampler::~GlobalSampler() = default;

std::vector<std::int64_t> GlobalSampler::permutation(std::int64_t epoch) const {
  CHORUS_CHECK_CONFIG(epoch >= 0, "sampler epoch must be >= 0, got ", epoch);
  std::vector<std::int64_t> ids(static_cast<size_t>(options_.dataset_size));
  std::iota(ids.begin(), ids.end(), std::int64_t{0});
  if (!options_.shuffle) return ids;
  // Fisher-Yates, from the top: every permutation equally likely, and the draw sequence depends on
  // nothing but (seed, epoch).
  SplitMix64 random(deriveSeed(options_.seed, static_cast<std::uint64_t>(epoch)));
  for (size_t i = ids.size(); i > 1; --i) {
    const auto j = static_cast<size_t>(random.below(i));
    std::swap(ids[i - 1], ids[j]);
  }
  return ids;
}

std::vector<std::int64_t> GlobalSampler::batch(std::int64_t step) const {
  CHORUS_CHECK_CONFIG(step >= 0, "sampler step must be >= 0, got ", step);
  const std::int64_t epoch = step / batches_per_epoch_;
  std::shared_ptr<const Cache> cache;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cache = cache_;
  }
  if (!cache || cache->epoch != epoch) {
    // Built outside the lock: concurrent callers of another epoch may duplicate work, never block.
    cache = std::make_shared<const Cache>(Cache{epoch, permutation(epoch)});
    std::lock_guard<std::mutex> lock(mutex_);
    cache_ = cache;
  }
  const std::int64_t begin = (step % batches_per_epoch_) * options_.global_batch;
  return std::vector<std::int64_t>(cache->ids.begin() + begin,
                                   cache->ids.begin() + begin + options_.global_batch);
}

std::int64_t GlobalSampler::epochOf(std::int64_t step) const {
  CHORUS_CHECK_CONFIG(step >= 0, "sampler step must be >= 0, got ", step);
  return step / batches_per_epoch_;
}

SamplerState GlobalSampler::state(std::int64_t step) const {
  CHORUS_CHECK_CONFIG(step >= 0, "sampler step must be >= 0, got ", step);
  return SamplerState{step / batches_per_epoch_,
                      (step % batches_per_epoch_) * options_.global_batch, step};
}

std::int64_t GlobalSampler::resume(const SamplerState& saved) const {
  const SamplerState expected = state(saved.step >= 0 ? saved.step : 0);
  if (saved.step < 0 || saved.epoch != expected.epoch || saved.position != expected.position)
    CHORUS_THROW(ConfigError, "sampler state (epoch ", saved.epoch, ", position ", saved.position,
                 ", step ", saved.step, ") does not fit a sampler of ", options_.dataset_size,
                 " samples and global batch ", options_.global_batch, " (expected epoch ",
                 expected.epoch, ", position ", expected.position,
                 "): was it saved with another dataset or batch size?");
  return saved.step;
}

}  // namespace chorus::data
