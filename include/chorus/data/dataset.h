// The dataset interface: samples addressed by integer id, fetched as stacked CPU tensors.
//
// A training step asks the GlobalSampler (sampler.h) for the step's global sample ids, takes its
// rank's slice (sharding.h) and fetches exactly those ids here. Because a sample is a pure function
// of its id, every placement of the same global batch sees the same data. Implementations:
// FashionMnist (fashion_mnist.h), TextCorpus (text_corpus.h), SyntheticClassification and
// SyntheticTokens (synthetic.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace chorus::data {

// Which part of a dataset with a fixed train/test division to use.
enum class Split { kTrain, kTest };

// "train" or "test".
const char* toString(Split split);

// A stacked batch on the CPU. `inputs` has shape [n, sampleShape()...] (float32 for images and
// features, int64 token ids for text); `targets` is int64, shape [n] for classification or
// [n, context] for language modelling. n may be 0.
struct Batch {
  at::Tensor inputs;
  at::Tensor targets;
};

// Abstract dataset of size() samples with ids 0 .. size()-1.
//
// Implementations are immutable after construction, so any number of threads may call any method
// concurrently (ranks of one process share one dataset). Not copyable: a dataset may hold the whole
// split in memory; share it through std::shared_ptr.
class Dataset {
 public:
  Dataset() = default;
  Dataset(const Dataset&) = delete;
  Dataset& operator=(const Dataset&) = delete;
  virtual ~Dataset() = default;

  // Number of samples.
  virtual std::int64_t size() const = 0;

  // The samples `ids`, stacked in that order (repeats allowed). An empty list gives tensors whose
  // leading dimension is 0, so a rank with a zero share runs the same code. Throws ConfigError
  // naming the dataset when an id is outside [0, size()).
  virtual Batch get(const std::vector<std::int64_t>& ids) const = 0;

  // A short name for logs and errors, e.g. "fashion-mnist/train".
  virtual std::string name() const = 0;

  // The shape of one sample's inputs, without the batch dimension, e.g. {1, 28, 28}.
  virtual std::vector<std::int64_t> sampleShape() const = 0;

  // Number of classes, or the vocabulary size for token datasets.
  virtual std::int64_t numClasses() const = 0;

 protected:
  // Throws ConfigError naming this dataset unless every id is in [0, size()).
  void checkIds(const std::vector<std::int64_t>& ids) const;
};

}  // namespace chorus::data
