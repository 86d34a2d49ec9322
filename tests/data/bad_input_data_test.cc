// Bad-input table, data files (DATA- rows of docs/errors.md): Fashion-MNIST IDX files and text
// corpora that are missing, truncated, of another format or inconsistent, and what the loaders
// say about each.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "bad_input_table.h"
#include "chorus/data/fashion_mnist.h"
#include "chorus/data/text_corpus.h"

namespace chorus::data {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;
using chorus::testing::BadInputRow;

void appendBigEndian(Bytes& out, std::uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back((value >> shift) & 0xff);
}

// IDX images: a header claiming `count` images of rows x cols, then `stored` images' pixels.
Bytes images(std::uint32_t count, std::uint32_t stored, std::uint32_t rows = 28,
             std::uint32_t cols = 28, std::uint32_t magic = 0x803) {
  Bytes out;
  for (std::uint32_t value : {magic, count, rows, cols}) appendBigEndian(out, value);
  out.resize(out.size() + static_cast<size_t>(stored) * rows * cols, 7);
  return out;
}

Bytes labels(std::uint32_t count, std::uint32_t magic = 0x801) {
  Bytes out;
  appendBigEndian(out, magic);
  appendBigEndian(out, count);
  for (std::uint32_t i = 0; i < count; ++i) out.push_back(i % 10);
  return out;
}

void write(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

void writeText(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

Bytes gzip(const Bytes& bytes, const std::string& scratch) {
  gzFile file = gzopen(scratch.c_str(), "wb");
  gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(file);
  std::ifstream in(scratch, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

struct DataRow {
  BadInputRow row;
  // Writes the files into the (empty) directory and returns what to load: the Fashion-MNIST
  // directory, or the text file when `text` is set.
  std::function<std::string(const std::string& dir)> setup;
  bool text = false;
  Split split = Split::kTrain;  // of a text corpus (Fashion-MNIST rows load the test split)
};

// gtest prints a failing row by its id.
void PrintTo(const DataRow& param, std::ostream* out) { *out << param.row.id; }

const std::string kImages = "/t10k-images-idx3-ubyte";
const std::string kLabels = "/t10k-labels-idx1-ubyte";

// A Fashion-MNIST test split of `images` and `labels` files, uncompressed.
std::function<std::string(const std::string&)> idx(Bytes image_file, Bytes label_file) {
  return [image_file, label_file](const std::string& dir) {
    write(dir + kImages, image_file);
    write(dir + kLabels, label_file);
    return dir;
  };
}

const std::vector<DataRow>& dataRows() {
  static const std::vector<DataRow> rows = {
      {{"DATA-01", "ConfigError", "Fashion-MNIST not found at /nonexistent/fashion: install"},
       [](const std::string&) { return std::string("/nonexistent/fashion"); }},
      {{"DATA-02", "ConfigError",
        "(no t10k-labels-idx1-ubyte.gz or t10k-labels-idx1-ubyte): install the Debian package"},
       [](const std::string& dir) {
         write(dir + kImages, images(10, 10));
         return dir;
       }},
      {{"DATA-03", "ConfigError", "is corrupt: magic number 0x801, expected 0x803"},
       idx(labels(10), labels(10))},
      {{"DATA-04", "ConfigError", "is corrupt: magic number 0x803, expected 0x801"},
       idx(images(10, 10), images(10, 10))},
      {{"DATA-05", "ConfigError",
        "is corrupt: truncated: expected 7840 bytes of pixels for 10 images, found 3920"},
       idx(images(10, 5), labels(10))},
      {{"DATA-06", "ConfigError", "is corrupt: truncated: expected 4 bytes of header, found 2"},
       idx(Bytes{0, 0, 8, 3, 0, 0}, labels(10))},
      {{"DATA-07", "ConfigError",
        "is corrupt: truncated: expected 39200 bytes of pixels for 50 images, found "},
       [](const std::string& dir) {
         Bytes gz = gzip(images(50, 50), dir + "/scratch");
         gz.resize(gz.size() / 2);
         write(dir + kImages + ".gz", gz);
         write(dir + kLabels, labels(50));
         return dir;
       }},
      {{"DATA-08", "ConfigError", "is corrupt: 1 unexpected bytes after 10 labels"},
       [](const std::string& dir) {
         Bytes longer = labels(10);
         longer.push_back(1);
         return idx(images(10, 10), longer)(dir);
       }},
      {{"DATA-09", "ConfigError", "Fashion-MNIST files disagree: "},
       idx(images(10, 10), labels(9))},
      {{"DATA-10", "ConfigError", "is corrupt: images are 28x27, expected 28x28"},
       idx(images(10, 10, 28, 27), labels(10))},
      {{"DATA-11", "ConfigError", "is corrupt: label 12 of image 3 is not a class (0..9)"},
       [](const std::string& dir) {
         Bytes bad = labels(10);
         bad[8 + 3] = 12;
         return idx(images(10, 10), bad)(dir);
       }},
      {{"DATA-12", "ConfigError",
        "is corrupt: truncated: expected 7839999216 bytes of pixels for 9999999 images, found "
        "7840"},
       idx(images(9'999'999, 10), labels(10))},
      {{"DATA-13", "ConfigError", "is corrupt: the header claims 4294967295 images"},
       idx(images(0xffffffff, 10), labels(10))},
      {{"DATA-14", "ConfigError", "text corpus not found at /nonexistent.txt"},
       [](const std::string&) { return std::string("/nonexistent.txt"); },
       true},
      {{"DATA-15", "ConfigError", "text corpus not found at "},
       [](const std::string& dir) { return dir; },
       true},
      {{"DATA-16", "ConfigError",
        "the train split has 0 characters, too few for one window of context 128 (needs 129)"},
       [](const std::string& dir) {
         writeText(dir + "/empty.txt", "");
         return dir + "/empty.txt";
       },
       true},
      {{"DATA-17", "ConfigError",
        "the test split has 5 characters, too few for one window of context 128 (needs 129)"},
       [](const std::string& dir) {
         writeText(dir + "/short.txt", std::string(50, 'a'));
         return dir + "/short.txt";
       },
       true,
       Split::kTest},
  };
  return rows;
}

class DataBadInput : public ::testing::TestWithParam<DataRow> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("chorus_bad_data_" + std::to_string(::getpid()) + "_" + GetParam().row.id);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
};

TEST_P(DataBadInput, IsRefusedNamingTheFile) {
  const DataRow& param = GetParam();
  const std::string what = param.setup(dir_.string());
  try {
    if (param.text) {
      TextCorpusOptions options;  // context 128, test fraction 0.1
      options.split = param.split;
      loadTextCorpus(what, options);
    } else {
      loadFashionMnist(what, Split::kTest);
    }
    ADD_FAILURE() << param.row.id << ": the data was accepted";
  } catch (const Error& error) {
    EXPECT_TRUE(chorus::testing::matchesRow(error, param.row));
    EXPECT_NE(error.message().find(what), std::string::npos) << error.message();
  }
}

INSTANTIATE_TEST_SUITE_P(Rows, DataBadInput, ::testing::ValuesIn(dataRows()),
                         chorus::testing::rowName<DataRow>);

TEST(DataBadInputTable, RowsMatchDocsErrorsMd) {
  chorus::testing::expectRowsDocumented("DATA-", chorus::testing::rowsOf(dataRows()));
}

}  // namespace
}  // namespace chorus::data
