#include "chorus/data/fashion_mnist.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "chorus/core/error.h"

namespace chorus::data {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;

// A fresh directory for one test, removed at the end.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("chorus_fashion_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string path() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

void appendBigEndian(Bytes& out, std::uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back((value >> shift) & 0xff);
}

// An IDX image file of `count` 28x28 images; pixel k of image i is (i * 31 + k) % 256.
Bytes images(std::uint32_t count, std::uint32_t rows = 28, std::uint32_t cols = 28,
             std::uint32_t magic = 0x803) {
  Bytes out;
  appendBigEndian(out, magic);
  appendBigEndian(out, count);
  appendBigEndian(out, rows);
  appendBigEndian(out, cols);
  for (std::uint32_t i = 0; i < count; ++i)
    for (std::uint32_t k = 0; k < rows * cols; ++k) out.push_back((i * 31 + k) % 256);
  return out;
}

// An IDX label file; label i is (i * 3) % 10.
Bytes labels(std::uint32_t count, std::uint32_t magic = 0x801) {
  Bytes out;
  appendBigEndian(out, magic);
  appendBigEndian(out, count);
  for (std::uint32_t i = 0; i < count; ++i) out.push_back((i * 3) % 10);
  return out;
}

void writePlain(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

void writeGzip(const std::string& path, const Bytes& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr);
  ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  gzclose(file);
}

float normalized(int pixel) {
  return (static_cast<float>(pixel) / 255.0f - kFashionMnistMean) / kFashionMnistStd;
}

// Expects loadFashionMnist(dir, kTest) to throw a ConfigError whose message contains every
// fragment.
void expectCorrupt(const TempDir& dir, const std::vector<std::string>& fragments) {
  try {
    loadFashionMnist(dir.path(), Split::kTest);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& error) {
    for (const auto& fragment : fragments)
      EXPECT_NE(error.message().find(fragment), std::string::npos)
          << "'" << fragment << "' missing from: " << error.message();
  }
}

TEST(FashionMnistFilesTest, ReadsGzipAndPlainFilesAlike) {
  TempDir gz, plain;
  writeGzip(gz.file("t10k-images-idx3-ubyte.gz"), images(3));
  writeGzip(gz.file("t10k-labels-idx1-ubyte.gz"), labels(3));
  writePlain(plain.file("t10k-images-idx3-ubyte"), images(3));
  writePlain(plain.file("t10k-labels-idx1-ubyte"), labels(3));
  const auto a = loadFashionMnist(gz.path(), Split::kTest);
  const auto b = loadFashionMnist(plain.path(), Split::kTest);
  ASSERT_EQ(a->size(), 3);
  ASSERT_EQ(b->size(), 3);
  const Batch batch = a->get({2, 0});
  EXPECT_EQ(batch.inputs.sizes(), (std::vector<std::int64_t>{2, 1, 28, 28}));
  EXPECT_EQ(batch.inputs.scalar_type(), at::kFloat);
  EXPECT_EQ(batch.targets.scalar_type(), at::kLong);
  EXPECT_EQ(batch.targets[0].item<std::int64_t>(), 6);
  EXPECT_EQ(batch.targets[1].item<std::int64_t>(), 0);
  // Image 2, pixel (0, 5): (2 * 31 + 5) % 256 = 67.
  EXPECT_FLOAT_EQ(batch.inputs[0][0][0][5].item<float>(), normalized(67));
  // Image 0, pixel (1, 0) = k 28.
  EXPECT_FLOAT_EQ(batch.inputs[1][0][1][0].item<float>(), normalized(28));
  EXPECT_TRUE(at::equal(batch.inputs, b->get({2, 0}).inputs));
}

TEST(FashionMnistFilesTest, MissingDirectoryNamesThePackage) {
  try {
    loadFashionMnist("/nonexistent/fashion", Split::kTrain);
    FAIL() << "no error";
  } catch (const ConfigError& error) {
    EXPECT_NE(error.message().find("/nonexistent/fashion"), std::string::npos);
    EXPECT_NE(error.message().find("dataset-fashion-mnist"), std::string::npos);
  }
}

TEST(FashionMnistFilesTest, MissingLabelFileIsNamed) {
  TempDir dir;
  writeGzip(dir.file("t10k-images-idx3-ubyte.gz"), images(3));
  expectCorrupt(dir, {"t10k-labels-idx1-ubyte", "dataset-fashion-mnist"});
}

TEST(FashionMnistFilesTest, BadMagicNumberIsNamed) {
  TempDir dir;
  writeGzip(dir.file("t10k-images-idx3-ubyte.gz"), images(3, 28, 28, 0x801));
  writeGzip(dir.file("t10k-labels-idx1-ubyte.gz"), labels(3));
  expectCorrupt(dir, {dir.file("t10k-images-idx3-ubyte.gz"), "magic number 0x801"});
}

TEST(FashionMnistFilesTest, BadLabelMagicNumberIsNamed) {
  TempDir dir;
  writePlain(dir.file("t10k-images-idx3-ubyte"), images(3));
  writePlain(dir.file("t10k-labels-idx1-ubyte"), labels(3, 0x803));
  expectCorrupt(dir, {dir.file("t10k-labels-idx1-ubyte"), "magic number 0x803"});
}

TEST(FashionMnistFilesTest, TruncatedFileIsNamed) {
  TempDir dir;
  Bytes truncated = images(3);
  truncated.resize(truncated.size() - 100);
  writeGzip(dir.file("t10k-images-idx3-ubyte.gz"), truncated);
  writeGzip(dir.file("t10k-labels-idx1-ubyte.gz"), labels(3));
  expectCorrupt(dir, {dir.file("t10k-images-idx3-ubyte.gz"), "truncated"});
}

TEST(FashionMnistFilesTest, TruncatedHeaderIsNamed) {
  TempDir dir;
  writePlain(dir.file("t10k-images-idx3-ubyte"), Bytes{0, 0, 8, 3, 0, 0});
  writePlain(dir.file("t10k-labels-idx1-ubyte"), labels(3));
  expectCorrupt(dir, {dir.file("t10k-images-idx3-ubyte"), "truncated"});
}

TEST(FashionMnistFilesTest, TruncatedGzipStreamIsNamed) {
  TempDir dir;
  writeGzip(dir.file("t10k-labels-idx1-ubyte.gz"), labels(3));
  writeGzip(dir.file("whole.gz"), images(50));
  // Cut the compressed stream itself, not only the data inside it.
  std::ifstream in(dir.file("whole.gz"), std::ios::binary);
  Bytes gz((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  gz.resize(gz.size() / 2);
  writePlain(dir.file("t10k-images-idx3-ubyte.gz"), gz);
  expectCorrupt(dir, {dir.file("t10k-images-idx3-ubyte.gz")});
}

TEST(FashionMnistFilesTest, TrailingBytesAreRejected) {
  TempDir dir;
  Bytes longer = labels(3);
  longer.push_back(1);
  writeGzip(dir.file("t10k-images-idx3-ubyte.gz"), images(3));
  writeGzip(dir.file("t10k-labels-idx1-ubyte.gz"), longer);
  expectCorrupt(dir, {dir.file("t10k-labels-idx1-ubyte.gz"), "1 unexpected bytes"});
}

TEST(FashionMnistFilesTest, CountMismatchNamesBothFiles) {
  TempDir dir;
  writeGzip(dir.file("t10k-images-idx3-ubyte.gz"), images(3));
  writeGzip(dir.file("t10k-labels-idx1-ubyte.gz"), labels(4));
  expectCorrupt(dir, {dir.file("t10k-images-idx3-ubyte.gz"), dir.file("t10k-labels-idx1-ubyte.gz"),
                      "3 images", "4 labels"});
}

TEST(FashionMnistFilesTest, WrongImageSizeIsRejected) {
  TempDir dir;
  writeGzip(dir.file("t10k-images-idx3-ubyte.gz"), images(3, 32, 32));
  writeGzip(dir.file("t10k-labels-idx1-ubyte.gz"), labels(3));
  expectCorrupt(dir, {dir.file("t10k-images-idx3-ubyte.gz"), "32x32"});
}

TEST(FashionMnistFilesTest, LabelOutsideTheClassesIsRejected) {
  TempDir dir;
  Bytes bad = labels(3);
  bad.back() = 10;
  writeGzip(dir.file("t10k-images-idx3-ubyte.gz"), images(3));
  writeGzip(dir.file("t10k-labels-idx1-ubyte.gz"), bad);
  expectCorrupt(dir, {dir.file("t10k-labels-idx1-ubyte.gz"), "label 10"});
}

// The real files of the Debian package, loaded once for the suite.
class FashionMnistRealTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(kDefaultFashionMnistDir)) return;
    train_ = loadFashionMnist(kDefaultFashionMnistDir, Split::kTrain);
    test_ = loadFashionMnist(kDefaultFashionMnistDir, Split::kTest);
  }
  static void TearDownTestSuite() {
    train_.reset();
    test_.reset();
  }
  void SetUp() override {
    if (!train_) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  }

  static std::shared_ptr<FashionMnist> train_;
  static std::shared_ptr<FashionMnist> test_;
};

std::shared_ptr<FashionMnist> FashionMnistRealTest::train_;
std::shared_ptr<FashionMnist> FashionMnistRealTest::test_;

TEST_F(FashionMnistRealTest, HasTheKnownSizesAndShapes) {
  EXPECT_EQ(train_->size(), 60000);
  EXPECT_EQ(test_->size(), 10000);
  EXPECT_EQ(train_->sampleShape(), (std::vector<std::int64_t>{1, 28, 28}));
  EXPECT_EQ(train_->numClasses(), 10);
  EXPECT_EQ(train_->name(), "fashion-mnist/train");
  EXPECT_EQ(test_->name(), "fashion-mnist/test");
}

TEST_F(FashionMnistRealTest, FirstLabelsAreTheKnownOnes) {
  // Both splits start with an ankle boot; the training split continues T-shirt, T-shirt, Dress.
  EXPECT_TRUE(at::equal(train_->get({0, 1, 2, 3}).targets,
                        at::tensor({9, 0, 0, 3}, at::TensorOptions().dtype(at::kLong))));
  EXPECT_EQ(train_->label(0), 9);
  EXPECT_EQ(FashionMnist::classNames()[train_->label(0)], "Ankle boot");
  EXPECT_EQ(test_->label(0), 9);
  EXPECT_EQ(test_->label(1), 2);
}

TEST_F(FashionMnistRealTest, LabelsAreBalancedClasses) {
  std::vector<std::int64_t> ids(60000);
  std::iota(ids.begin(), ids.end(), 0);
  std::vector<int> counts(10, 0);
  for (const std::int64_t id : ids) {
    const std::int64_t label = train_->label(id);
    ASSERT_GE(label, 0);
    ASSERT_LT(label, 10);
    ++counts[label];
  }
  EXPECT_EQ(counts, std::vector<int>(10, 6000));  // Fashion-MNIST has 6,000 of each class
}

TEST_F(FashionMnistRealTest, InputsAreNormalized) {
  std::vector<std::int64_t> ids;
  for (std::int64_t id = 0; id < 60000; id += 10) ids.push_back(id);
  const Batch batch = train_->get(ids);
  EXPECT_NEAR(batch.inputs.mean().item<double>(), 0.0, 0.02);
  EXPECT_NEAR(batch.inputs.std().item<double>(), 1.0, 0.02);
  EXPECT_FLOAT_EQ(batch.inputs.min().item<float>(), normalized(0));
  EXPECT_FLOAT_EQ(batch.inputs.max().item<float>(), normalized(255));
}

TEST_F(FashionMnistRealTest, EmptyIdListGivesEmptyBatch) {
  const Batch batch = train_->get({});
  EXPECT_EQ(batch.inputs.sizes(), (std::vector<std::int64_t>{0, 1, 28, 28}));
  EXPECT_EQ(batch.targets.sizes(), (std::vector<std::int64_t>{0}));
}

TEST_F(FashionMnistRealTest, OutOfRangeIdIsRejected) {
  EXPECT_THROW(train_->get({0, 60000}), ConfigError);
  EXPECT_THROW(test_->get({-1}), ConfigError);
}

TEST_F(FashionMnistRealTest, ConcurrentReadsAgree) {
  const std::vector<std::int64_t> ids = {5, 50, 500, 5000, 50000};
  const Batch expected = train_->get(ids);
  std::vector<int> same(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) same[t] += at::equal(train_->get(ids).inputs, expected.inputs);
    });
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(same, std::vector<int>(4, 20));
}

}  // namespace
}  // namespace chorus::data
