// Fashion-MNIST (Xiao, Rasul and Vollgraf, 2017): 28×28 grey images of clothing in 10 classes,
// 60,000 for training and 10,000 for testing.
//
// Read from the IDX files that Debian's `dataset-fashion-mnist` package installs (scripts/setup
// does), gzip-compressed or not. A whole split is kept in memory as bytes (47 MB for training) and
// converted to normalized float32 per batch. Every problem with the files (missing, wrong magic
// number or dimensions, truncated, trailing bytes, images and labels that disagree) is a
// ConfigError naming the file, raised when the dataset is loaded, never later.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chorus/data/dataset.h"

namespace chorus::data {

// Where the Debian package puts the files.
inline constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// Mean and standard deviation of the training pixels scaled to [0, 1]; inputs are normalized as
// (x / 255 - kFashionMnistMean) / kFashionMnistStd.
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;

inline constexpr std::int64_t kFashionMnistRows = 28;
inline constexpr std::int64_t kFashionMnistCols = 28;
inline constexpr std::int64_t kFashionMnistClasses = 10;

// One split of Fashion-MNIST. inputs float32 [n, 1, 28, 28], targets int64 [n] in 0..9.
//
// Immutable after loading; safe for concurrent get() from any number of threads. Not copyable;
// share it through std::shared_ptr.
class FashionMnist final : public Dataset {
 public:
  // Takes the raw split: `pixels` holds size * 28 * 28 bytes, row-major per image; `labels` one
  // byte in 0..9 per image. Throws ConfigError if the sizes disagree or a label is out of range.
  FashionMnist(Split split, std::vector<std::uint8_t> pixels, std::vector<std::uint8_t> labels);

  std::int64_t size() const override { return static_cast<std::int64_t>(labels_.size()); }
  Batch get(const std::vector<std::int64_t>& ids) const override;
  std::string name() const override;
  std::vector<std::int64_t> sampleShape() const override;
  std::int64_t numClasses() const override { return kFashionMnistClasses; }

  Split split() const { return split_; }
  // The raw label of sample `id` (0..9). REQUIRES: 0 <= id < size().
  std::int64_t label(std::int64_t id) const { return labels_[static_cast<size_t>(id)]; }

  // The English names of the 10 classes, by label ("T-shirt/top", ..., "Ankle boot").
  static const std::vector<std::string>& classNames();

 private:
  Split split_;
  std::vector<std::uint8_t> pixels_;
  std::vector<std::uint8_t> labels_;
};

// Loads split `split` from `dir`, which holds train-images-idx3-ubyte.gz,
// train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz (or the same
// names without .gz, uncompressed). Throws ConfigError when the files are missing or corrupt.
std::shared_ptr<FashionMnist> loadFashionMnist(const std::string& dir = kDefaultFashionMnistDir,
                                               Split split = Split::kTrain);

}  // namespace chorus::data
