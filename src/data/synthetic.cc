#include "chorus/data/synthetic.h"

#include <ATen/ATen.h>

#include <numeric>
#include <utility>

#include "chorus/core/error.h"
#include "chorus/data/random.h"

namespace chorus::data {
namespace {

// Salts that separate the streams of one seed: per-sample draws, per-class prototypes, the
// successor table.
constexpr std::uint64_t kSampleStream = 0x73616d706c65ULL;   // "sample"
constexpr std::uint64_t kPrototypeStream = 0x70726f746fULL;  // "proto"
constexpr std::uint64_t kSuccessorStream = 0x7375636365ULL;  // "succe"

// Per mille chance that the next token follows the chain rather than being uniform.
constexpr std::uint64_t kFollowPerMille = 750;

std::uint64_t sampleSeed(std::uint64_t seed, std::int64_t id) {
  return deriveSeed(seed ^ kSampleStream, static_cast<std::uint64_t>(id));
}

std::string describe(const std::vector<std::int64_t>& shape) {
  std::string text;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text.push_back('x');
    text.append(std::to_string(shape[i]));
  }
  return text;
}

}  // namespace

SyntheticClassification::SyntheticClassification(std::int64_t size,
                                                 std::vector<std::int64_t> sample_shape,
                                                 std::int64_t classes, std::uint64_t seed)
    : size_(size), shape_(std::move(sample_shape)), features_(1), classes_(classes), seed_(seed) {
  CHORUS_CHECK_CONFIG(size >= 0, "synthetic dataset size must be >= 0, got ", size);
  CHORUS_CHECK_CONFIG(classes >= 1, "synthetic dataset needs at least 1 class, got ", classes);
  CHORUS_CHECK_CONFIG(!shape_.empty(), "synthetic dataset needs a sample shape");
  for (const std::int64_t dim : shape_) {
    CHORUS_CHECK_CONFIG(dim >= 1, "synthetic sample shape ", describe(shape_),
                        " has a dimension < 1");
    features_ *= dim;
  }
}

std::int64_t SyntheticClassification::label(std::int64_t id) const {
  SplitMix64 random(sampleSeed(seed_, id));
  return static_cast<std::int64_t>(random.below(static_cast<std::uint64_t>(classes_)));
}

Batch SyntheticClassification::get(const std::vector<std::int64_t>& ids) const {
  checkIds(ids);
  const auto n = static_cast<std::int64_t>(ids.size());
  std::vector<std::int64_t> shape{n};
  shape.insert(shape.end(), shape_.begin(), shape_.end());
  at::Tensor inputs = at::empty(shape, at::kFloat);
  at::Tensor targets = at::empty({n}, at::kLong);
  float* out = inputs.data_ptr<float>();
  std::int64_t* labels = targets.data_ptr<std::int64_t>();
  for (std::int64_t row = 0; row < n; ++row) {
    // The label comes first in the sample's stream, so label() needs only one draw.
    SplitMix64 noise(sampleSeed(seed_, ids[row]));
    const auto label = static_cast<std::int64_t>(noise.below(static_cast<std::uint64_t>(classes_)));
    SplitMix64 prototype(deriveSeed(seed_ ^ kPrototypeStream, static_cast<std::uint64_t>(label)));
    float* x = out + row * features_;
    // Both terms are multiples of 2^-23 below 1 in magnitude, so the sum is exact.
    for (std::int64_t j = 0; j < features_; ++j)
      x[j] = prototype.symmetricUnit() + noise.symmetricUnit();
    labels[row] = label;
  }
  return Batch{std::move(inputs), std::move(targets)};
}

std::string SyntheticClassification::name() const {
  return "synthetic-classification/" + describe(shape_) + "/" + std::to_string(classes_);
}

SyntheticTokens::SyntheticTokens(std::int64_t size, std::int64_t context, std::int64_t vocab,
                                 std::uint64_t seed)
    : size_(size), context_(context), vocab_(vocab), seed_(seed) {
  CHORUS_CHECK_CONFIG(size >= 0, "synthetic dataset size must be >= 0, got ", size);
  CHORUS_CHECK_CONFIG(context >= 1, "synthetic token context must be >= 1, got ", context);
  CHORUS_CHECK_CONFIG(vocab >= 1, "synthetic token vocabulary must be >= 1, got ", vocab);
  successor_.resize(static_cast<size_t>(vocab));
  std::iota(successor_.begin(), successor_.end(), std::int64_t{0});
  SplitMix64 random(deriveSeed(seed ^ kSuccessorStream, 0));
  for (size_t i = successor_.size(); i > 1; --i)
    std::swap(successor_[i - 1], successor_[random.below(i)]);
}

Batch SyntheticTokens::get(const std::vector<std::int64_t>& ids) const {
  checkIds(ids);
  const auto n = static_cast<std::int64_t>(ids.size());
  at::Tensor inputs = at::empty({n, context_}, at::kLong);
  at::Tensor targets = at::empty({n, context_}, at::kLong);
  std::int64_t* in = inputs.data_ptr<std::int64_t>();
  std::int64_t* out = targets.data_ptr<std::int64_t>();
  const auto vocab = static_cast<std::uint64_t>(vocab_);
  for (std::int64_t row = 0; row < n; ++row) {
    SplitMix64 random(sampleSeed(seed_, ids[row]));
    auto token = static_cast<std::int64_t>(random.below(vocab));
    for (std::int64_t k = 0; k < context_; ++k) {
      in[row * context_ + k] = token;
      token = random.below(1000) < kFollowPerMille ? successor(token)
                                                   : static_cast<std::int64_t>(random.below(vocab));
      out[row * context_ + k] = token;
    }
  }
  return Batch{std::move(inputs), std::move(targets)};
}

std::string SyntheticTokens::name() const {
  return "synthetic-tokens/" + std::to_string(context_) + "/" + std::to_string(vocab_);
}

}  // namespace chorus::data
