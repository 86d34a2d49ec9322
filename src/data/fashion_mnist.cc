#include "chorus/data/fashion_mnist.h"

#include <zlib.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <sstream>
#include <utility>

#include "chorus/core/error.h"

namespace chorus::data {
namespace {

namespace fs = std::filesystem;

constexpr std::uint32_t kImagesMagic = 0x00000803;  // IDX: unsigned bytes, 3 dimensions
constexpr std::uint32_t kLabelsMagic = 0x00000801;  // IDX: unsigned bytes, 1 dimension
constexpr std::int64_t kPixels = kFashionMnistRows * kFashionMnistCols;
// A header claiming more images than this is corrupt; refusing it avoids a huge allocation.
constexpr std::uint32_t kMaxImages = 10'000'000;
// gzread takes an unsigned int length; read in chunks well below that.
constexpr size_t kReadChunk = size_t{1} << 24;

[[noreturn]] void notFound(const std::string& dir, const std::string& detail) {
  CHORUS_THROW(ConfigError, "Fashion-MNIST not found at ", dir, detail,
               ": install the Debian package dataset-fashion-mnist (scripts/setup does)");
}

[[noreturn]] void corrupt(const std::string& path, const std::string& what) {
  CHORUS_THROW(ConfigError, "Fashion-MNIST file ", path, " is corrupt: ", what);
}

std::string hex(std::uint32_t value) {
  std::ostringstream out;
  out << "0x" << std::hex << value;
  return out.str();
}

// The path of `name` in `dir`: the gzip file if present, else the uncompressed one.
std::string locate(const std::string& dir, const std::string& name) {
  std::error_code error;
  if (!fs::is_directory(dir, error)) notFound(dir, "");
  const fs::path gz = fs::path(dir) / (name + ".gz");
  if (fs::is_regular_file(gz, error)) return gz.string();
  const fs::path plain = fs::path(dir) / name;
  if (fs::is_regular_file(plain, error)) return plain.string();
  notFound(dir, " (no " + name + ".gz or " + name + ")");
}

// A gzip (or, through zlib's transparent mode, plain) file opened for reading. Owns the handle.
class GzReader {
 public:
  explicit GzReader(std::string path) : path_(std::move(path)) {
    file_ = gzopen(path_.c_str(), "rb");
    if (file_ == nullptr) notFound(path_, " (cannot open the file)");
    gzbuffer(file_, 1 << 17);
  }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;
  ~GzReader() { gzclose(file_); }

  // Reads up to `size` bytes; returns how many were read (fewer only at the end of the data).
  size_t read(std::uint8_t* data, size_t size) {
    size_t done = 0;
    while (done < size) {
      const auto want = static_cast<unsigned>(std::min(kReadChunk, size - done));
      const int got = gzread(file_, data + done, want);
      if (got < 0) {
        int code = 0;
        corrupt(path_, std::string("gzip error: ") + gzerror(file_, &code));
      }
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    return done;
  }

  // Reads `size` bytes, growing the buffer as they arrive: a corrupt header can claim gigabytes
  // that a truncated file does not hold, and allocating them up front ran out of memory before
  // the truncation could be reported.
  std::vector<std::uint8_t> readBytes(size_t size, const std::string& what) {
    std::vector<std::uint8_t> data;
    while (data.size() < size) {
      const size_t before = data.size();
      const size_t want = std::min(kReadChunk, size - before);
      data.resize(before + want);
      data.resize(before + read(data.data() + before, want));
      if (data.size() < before + want)
        corrupt(path_, "truncated: expected " + std::to_string(size) + " bytes of " + what +
                           ", found " + std::to_string(data.size()));
    }
    return data;
  }

  void readExactly(std::uint8_t* data, size_t size, const std::string& what) {
    const size_t got = read(data, size);
    if (got != size)
      corrupt(path_, "truncated: expected " + std::to_string(size) + " bytes of " + what +
                         ", found " + std::to_string(got));
  }

  std::uint32_t readBigEndian32(const std::string& what) {
    std::array<std::uint8_t, 4> bytes{};
    readExactly(bytes.data(), bytes.size(), what);
    return (std::uint32_t{bytes[0]} << 24) | (std::uint32_t{bytes[1]} << 16) |
           (std::uint32_t{bytes[2]} << 8) | std::uint32_t{bytes[3]};
  }

  // Fails unless the data ended: the header fixes the file size, so extra bytes mean a bad file.
  void expectEnd(const std::string& after) {
    std::array<std::uint8_t, 4096> rest{};
    size_t extra = 0;
    for (size_t got; (got = read(rest.data(), rest.size())) > 0;) extra += got;
    if (extra > 0)
      corrupt(path_, std::to_string(extra) + " unexpected bytes after " + after +
                         " (the file is larger than its header says)");
  }

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  gzFile file_;
};

void expectMagic(GzReader& reader, std::uint32_t expected, const char* kind) {
  const std::uint32_t magic = reader.readBigEndian32("header");
  if (magic != expected)
    corrupt(reader.path(),
            "magic number " + hex(magic) + ", expected " + hex(expected) + " (" + kind + ")");
}

struct RawSplit {
  std::string images_path;
  std::string labels_path;
  std::vector<std::uint8_t> pixels;
  std::vector<std::uint8_t> labels;
};

std::vector<std::uint8_t> readImages(const std::string& path) {
  GzReader reader(path);
  expectMagic(reader, kImagesMagic, "IDX images of unsigned bytes");
  const std::uint32_t count = reader.readBigEndian32("header");
  const std::uint32_t rows = reader.readBigEndian32("header");
  const std::uint32_t cols = reader.readBigEndian32("header");
  if (rows != kFashionMnistRows || cols != kFashionMnistCols)
    corrupt(path,
            "images are " + std::to_string(rows) + "x" + std::to_string(cols) + ", expected 28x28");
  if (count > kMaxImages) corrupt(path, "the header claims " + std::to_string(count) + " images");
  std::vector<std::uint8_t> pixels = reader.readBytes(
      static_cast<size_t>(count) * kPixels, "pixels for " + std::to_string(count) + " images");
  reader.expectEnd(std::to_string(count) + " images");
  return pixels;
}

std::vector<std::uint8_t> readLabels(const std::string& path) {
  GzReader reader(path);
  expectMagic(reader, kLabelsMagic, "IDX labels of unsigned bytes");
  const std::uint32_t count = reader.readBigEndian32("header");
  if (count > kMaxImages) corrupt(path, "the header claims " + std::to_string(count) + " labels");
  std::vector<std::uint8_t> labels = reader.readBytes(count, std::to_string(count) + " labels");
  reader.expectEnd(std::to_string(count) + " labels");
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= kFashionMnistClasses)
      corrupt(path, "label " + std::to_string(labels[i]) + " of image " + std::to_string(i) +
                        " is not a class (0..9)");
  }
  return labels;
}

}  // namespace

FashionMnist::FashionMnist(Split split, std::vector<std::uint8_t> pixels,
                           std::vector<std::uint8_t> labels)
    : split_(split), pixels_(std::move(pixels)), labels_(std::move(labels)) {
  CHORUS_CHECK_CONFIG(pixels_.size() == labels_.size() * kPixels, "Fashion-MNIST ", toString(split),
                      ": ", pixels_.size(), " pixel bytes do not make ", labels_.size(),
                      " images of 28x28");
  for (const std::uint8_t label : labels_)
    CHORUS_CHECK_CONFIG(label < kFashionMnistClasses, "Fashion-MNIST ", toString(split), ": label ",
                        int{label}, " is not a class (0..9)");
}

Batch FashionMnist::get(const std::vector<std::int64_t>& ids) const {
  checkIds(ids);
  // Computed per call (256 values), so the conversion is exactly that of the documented formula.
  std::array<float, 256> normalized{};
  for (int value = 0; value < 256; ++value)
    normalized[value] = (static_cast<float>(value) / 255.0f - kFashionMnistMean) / kFashionMnistStd;

  const auto n = static_cast<std::int64_t>(ids.size());
  at::Tensor inputs = at::empty({n, 1, kFashionMnistRows, kFashionMnistCols}, at::kFloat);
  at::Tensor targets = at::empty({n}, at::kLong);
  float* out = inputs.data_ptr<float>();
  std::int64_t* labels = targets.data_ptr<std::int64_t>();
  for (std::int64_t row = 0; row < n; ++row) {
    const auto id = static_cast<size_t>(ids[row]);
    const std::uint8_t* in = pixels_.data() + id * kPixels;
    float* dst = out + row * kPixels;
    for (std::int64_t k = 0; k < kPixels; ++k) dst[k] = normalized[in[k]];
    labels[row] = labels_[id];
  }
  return Batch{std::move(inputs), std::move(targets)};
}

std::string FashionMnist::name() const { return std::string("fashion-mnist/") + toString(split_); }

std::vector<std::int64_t> FashionMnist::sampleShape() const {
  return {1, kFashionMnistRows, kFashionMnistCols};
}

const std::vector<std::string>& FashionMnist::classNames() {
  static const std::vector<std::string> names = {"T-shirt/top", "Trouser",   "Pullover", "Dress",
                                                 "Coat",        "Sandal",    "Shirt",    "Sneaker",
                                                 "Bag",         "Ankle boot"};
  return names;
}

std::shared_ptr<FashionMnist> loadFashionMnist(const std::string& dir, Split split) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  const std::string images_path = locate(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = locate(dir, prefix + "-labels-idx1-ubyte");
  std::vector<std::uint8_t> pixels = readImages(images_path);
  std::vector<std::uint8_t> labels = readLabels(labels_path);
  const size_t images = pixels.size() / kPixels;
  if (images != labels.size())
    CHORUS_THROW(ConfigError, "Fashion-MNIST files disagree: ", images_path, " has ", images,
                 " images but ", labels_path, " has ", labels.size(), " labels");
  return std::make_shared<FashionMnist>(split, std::move(pixels), std::move(labels));
}

}  // namespace chorus::data
