#include "chorus/data/text_corpus.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "chorus/core/error.h"

namespace chorus::data {
namespace {

namespace fs = std::filesystem;

constexpr const char* kText = "the cat sat on the mat";  // 22 bytes, 10 distinct

// Writes `text` to a fresh temporary file, removed at the end.
class TempText {
 public:
  explicit TempText(const std::string& text) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("chorus_text_" + std::to_string(::getpid()) + "_" + info->name() + ".txt");
    std::ofstream(path_, std::ios::binary) << text;
  }
  ~TempText() { fs::remove(path_); }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

std::vector<std::int64_t> row(const at::Tensor& tensor, std::int64_t index) {
  const at::Tensor r = tensor[index].contiguous();
  return std::vector<std::int64_t>(r.data_ptr<std::int64_t>(),
                                   r.data_ptr<std::int64_t>() + r.numel());
}

TEST(VocabularyTest, IsTheSortedSetOfBytes) {
  const Vocabulary vocabulary(kText);
  EXPECT_EQ(vocabulary.size(), 10);
  const std::vector<std::uint8_t> expected = {' ', 'a', 'c', 'e', 'h', 'm', 'n', 'o', 's', 't'};
  EXPECT_EQ(vocabulary.bytes(), expected);
  EXPECT_EQ(vocabulary.encode("at "), (std::vector<std::int64_t>{1, 9, 0}));
  EXPECT_EQ(vocabulary.decode(vocabulary.encode(kText)), kText);
  EXPECT_EQ(vocabulary.idOf('z'), -1);
  EXPECT_THROW(vocabulary.encode("zebra"), ConfigError);
  EXPECT_THROW(vocabulary.decode({10}), ConfigError);
}

TEST(TextCorpusTest, WindowsAndTargetsShiftedByOne) {
  TempText file(kText);
  TextCorpusOptions options;
  options.context = 4;
  options.test_fraction = 0.5;  // cut at byte 11: "the cat sat" | " on the mat"
  const auto train = loadTextCorpus(file.path(), options);
  EXPECT_EQ(train->tokens(), 11);
  EXPECT_EQ(train->stride(), 4);
  EXPECT_EQ(train->size(), 2);  // windows at 0 and 4; one at 8 would need bytes 8..12
  EXPECT_EQ(train->sampleShape(), (std::vector<std::int64_t>{4}));
  EXPECT_EQ(train->numClasses(), 10);
  EXPECT_EQ(train->name(), file.path().substr(file.path().rfind('/') + 1) + "/train");

  const Batch batch = train->get({1, 0});
  EXPECT_EQ(batch.inputs.sizes(), (std::vector<std::int64_t>{2, 4}));
  EXPECT_EQ(batch.inputs.scalar_type(), at::kLong);
  EXPECT_EQ(batch.targets.scalar_type(), at::kLong);
  const Vocabulary& vocabulary = train->vocabulary();
  EXPECT_EQ(vocabulary.decode(row(batch.inputs, 0)), "cat ");
  EXPECT_EQ(vocabulary.decode(row(batch.targets, 0)), "at s");
  EXPECT_EQ(vocabulary.decode(row(batch.inputs, 1)), "the ");
  EXPECT_EQ(vocabulary.decode(row(batch.targets, 1)), "he c");
}

TEST(TextCorpusTest, TestSplitIsTheTailWithTheSameVocabulary) {
  TextCorpusOptions options;
  options.split = Split::kTest;
  options.context = 4;
  options.stride = 2;
  options.test_fraction = 0.5;
  const TextCorpus test(kText, options);
  EXPECT_EQ(test.tokens(), 11);
  EXPECT_EQ(test.size(), 4);         // windows at 0, 2, 4, 6 of " on the mat"
  EXPECT_EQ(test.numClasses(), 10);  // 'c' only occurs in the training part
  const Batch batch = test.get({2, 3});
  EXPECT_EQ(test.vocabulary().decode(row(batch.inputs, 0)), "the ");
  EXPECT_EQ(test.vocabulary().decode(row(batch.targets, 0)), "he m");
  EXPECT_EQ(test.vocabulary().decode(row(batch.inputs, 1)), "e ma");
  EXPECT_EQ(test.vocabulary().decode(row(batch.targets, 1)), " mat");  // the last byte
  EXPECT_EQ(test.name(), "text/test");
}

TEST(TextCorpusTest, EmptyIdListGivesEmptyBatch) {
  const TextCorpus corpus(kText, TextCorpusOptions{Split::kTrain, 3, 0, 0.1});
  const Batch batch = corpus.get({});
  EXPECT_EQ(batch.inputs.sizes(), (std::vector<std::int64_t>{0, 3}));
  EXPECT_EQ(batch.targets.sizes(), (std::vector<std::int64_t>{0, 3}));
  EXPECT_THROW(corpus.get({corpus.size()}), ConfigError);
}

TEST(TextCorpusTest, MissingFileNamesThePathAndTheSetup) {
  try {
    loadTextCorpus("/nonexistent/book.txt");
    FAIL() << "no error";
  } catch (const ConfigError& error) {
    EXPECT_NE(error.message().find("/nonexistent/book.txt"), std::string::npos);
    EXPECT_NE(error.message().find("scripts/setup"), std::string::npos);
  }
}

TEST(TextCorpusTest, RejectsInvalidOptionsAndTooShortSplits) {
  EXPECT_THROW(TextCorpus(kText, TextCorpusOptions{Split::kTrain, 0, 0, 0.1}), ConfigError);
  EXPECT_THROW(TextCorpus(kText, TextCorpusOptions{Split::kTrain, 4, -1, 0.1}), ConfigError);
  EXPECT_THROW(TextCorpus(kText, TextCorpusOptions{Split::kTrain, 4, 0, 0.0}), ConfigError);
  EXPECT_THROW(TextCorpus(kText, TextCorpusOptions{Split::kTrain, 4, 0, 1.0}), ConfigError);
  // The test split has 3 bytes: no window of context 4 fits.
  EXPECT_THROW(TextCorpus(kText, TextCorpusOptions{Split::kTest, 4, 0, 0.1}), ConfigError);
}

TEST(TextCorpusTest, LoadsMobyDick) {
  if (!fs::exists(kDefaultTextPath)) GTEST_SKIP() << kDefaultTextPath << " is missing";
  const auto train = loadTextCorpus();
  TextCorpusOptions options;
  options.split = Split::kTest;
  const auto test = loadTextCorpus(kDefaultTextPath, options);
  const auto bytes = static_cast<std::int64_t>(fs::file_size(kDefaultTextPath));
  EXPECT_EQ(train->tokens() + test->tokens(), bytes);
  EXPECT_NEAR(static_cast<double>(test->tokens()) / bytes, 0.1, 1e-3);
  EXPECT_EQ(train->size(), (train->tokens() - 129) / 128 + 1);
  EXPECT_EQ(train->numClasses(), test->numClasses());
  EXPECT_GT(train->numClasses(), 60);  // letters of both cases, digits, punctuation
  EXPECT_LE(train->numClasses(), 256);
  EXPECT_EQ(train->name(), "mobydick.txt/train");
  const Batch batch = train->get({0});
  EXPECT_EQ(batch.inputs.sizes(), (std::vector<std::int64_t>{1, 128}));
  const std::string start = train->vocabulary().decode(row(batch.inputs, 0));
  EXPECT_NE(start.find("Moby Dick"), std::string::npos) << start;
}

}  // namespace
}  // namespace chorus::data
