// A character-level text corpus for language modelling (the GPT of the model zoo).
//
// The text is read as bytes; the vocabulary is the sorted set of bytes that occur anywhere in the
// document, so the train and test splits share it. The document is cut once: the first
// (1 - test_fraction) of the bytes are the training split, the rest the test split. Sample i of a
// split is the window of `context` tokens starting at i * stride, and its targets are the same
// window shifted by one token (the next character at every position); only full windows count.
// The default document is Moby Dick, which scripts/setup extracts to kDefaultTextPath.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chorus/data/dataset.h"

namespace chorus::data {

inline constexpr const char* kDefaultTextPath = "/var/lib/chorus/data/mobydick.txt";

// Maps the bytes of one document to token ids 0 .. size()-1 in byte order. An immutable value;
// safe to share between threads.
class Vocabulary {
 public:
  // The vocabulary of the bytes occurring in `text`.
  explicit Vocabulary(const std::string& text);

  // Number of distinct bytes (1..256; 0 only for an empty document).
  std::int64_t size() const { return static_cast<std::int64_t>(bytes_.size()); }
  // The bytes of the vocabulary, sorted; token id i stands for bytes()[i].
  const std::vector<std::uint8_t>& bytes() const { return bytes_; }

  // The token ids of `text`. Throws ConfigError on a byte outside the vocabulary.
  std::vector<std::int64_t> encode(const std::string& text) const;
  // The text of `tokens`. Throws ConfigError on an id outside [0, size()).
  std::string decode(const std::vector<std::int64_t>& tokens) const;
  // The token id of `byte`, or -1 when it is not in the vocabulary.
  std::int64_t idOf(std::uint8_t byte) const { return ids_[byte]; }

 private:
  std::vector<std::uint8_t> bytes_;
  std::array<std::int16_t, 256> ids_;
};

// Options of a TextCorpus.
struct TextCorpusOptions {
  // Which part of the document. Default: Split::kTrain.
  Split split = Split::kTrain;
  // Tokens per sample (the model's context length). REQUIRES: >= 1. Default: 128.
  std::int64_t context = 128;
  // Tokens between the starts of consecutive samples; 0 means `context` (windows that do not
  // overlap). REQUIRES: >= 0. Default: 0.
  std::int64_t stride = 0;
  // The fraction of the document, at its end, that forms the test split. REQUIRES: in (0, 1).
  // Default: 0.1.
  double test_fraction = 0.1;
};

// One split of a character-level corpus. inputs int64 [n, context], targets int64 [n, context].
//
// Immutable after construction; safe for concurrent get() from any number of threads. Not
// copyable; share it through std::shared_ptr.
class TextCorpus final : public Dataset {
 public:
  // A corpus over the document `text`; `source` names it in name() and errors (e.g. the file).
  // Throws ConfigError for invalid options or a split too short for one window.
  TextCorpus(const std::string& text, const TextCorpusOptions& options,
             std::string source = "text");

  std::int64_t size() const override { return windows_; }
  Batch get(const std::vector<std::int64_t>& ids) const override;
  std::string name() const override;
  std::vector<std::int64_t> sampleShape() const override { return {options_.context}; }
  std::int64_t numClasses() const override { return vocabulary_.size(); }

  const Vocabulary& vocabulary() const { return vocabulary_; }
  const TextCorpusOptions& options() const { return options_; }
  // The effective stride (options().stride, or context when that is 0).
  std::int64_t stride() const { return stride_; }
  // Number of tokens in this split.
  std::int64_t tokens() const { return static_cast<std::int64_t>(tokens_.size()); }

 private:
  TextCorpusOptions options_;
  std::string source_;
  Vocabulary vocabulary_;
  std::int64_t stride_;
  // The split's token ids; fit in a byte because the vocabulary has at most 256 entries.
  std::vector<std::uint8_t> tokens_;
  std::int64_t windows_;
};

// Loads the document at `path` (default: Moby Dick, put there by scripts/setup). Throws ConfigError
// naming the path when it cannot be read, and for invalid options.
std::shared_ptr<TextCorpus> loadTextCorpus(const std::string& path = kDefaultTextPath,
                                           const TextCorpusOptions& options = {});

}  // namespace chorus::data
