#include "chorus/data/text_corpus.h"

#include <ATen/ATen.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <utility>

#include "chorus/core/error.h"

namespace chorus::data {

Vocabulary::Vocabulary(const std::string& text) {
  std::array<bool, 256> seen{};
  for (const char c : text) seen[static_cast<std::uint8_t>(c)] = true;
  ids_.fill(-1);
  for (int byte = 0; byte < 256; ++byte) {
    if (!seen[byte]) continue;
    ids_[byte] = static_cast<std::int16_t>(bytes_.size());
    bytes_.push_back(static_cast<std::uint8_t>(byte));
  }
}

std::vector<std::int64_t> Vocabulary::encode(const std::string& text) const {
  std::vector<std::int64_t> tokens;
  tokens.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<std::uint8_t>(text[i]);
    CHORUS_CHECK_CONFIG(ids_[byte] >= 0, "byte ", int{byte}, " at offset ", i,
                        " is not in the vocabulary");
    tokens.push_back(ids_[byte]);
  }
  return tokens;
}

std::string Vocabulary::decode(const std::vector<std::int64_t>& tokens) const {
  std::string text;
  text.reserve(tokens.size());
  for (const std::int64_t token : tokens) {
    CHORUS_CHECK_CONFIG(token >= 0 && token < size(), "token ", token,
                        " is not in the vocabulary of ", size(), " tokens");
    text.push_back(static_cast<char>(bytes_[static_cast<size_t>(token)]));
  }
  return text;
}

TextCorpus::TextCorpus(const std::string& text, const TextCorpusOptions& options,
                       std::string source)
    : options_(options), source_(std::move(source)), vocabulary_(text) {
  CHORUS_CHECK_CONFIG(options.context >= 1, "text corpus ", source_,
                      ": the context must be at least 1, got ", options.context);
  CHORUS_CHECK_CONFIG(options.stride >= 0, "text corpus ", source_,
                      ": the stride must be >= 0, got ", options.stride);
  CHORUS_CHECK_CONFIG(options.test_fraction > 0.0 && options.test_fraction < 1.0, "text corpus ",
                      source_, ": the test fraction must be in (0, 1), got ",
                      options.test_fraction);
  stride_ = options.stride == 0 ? options.context : options.stride;

  const auto cut = static_cast<size_t>(
      std::floor(static_cast<double>(text.size()) * (1.0 - options.test_fraction)));
  const size_t begin = options.split == Split::kTrain ? 0 : cut;
  const size_t end = options.split == Split::kTrain ? cut : text.size();
  tokens_.reserve(end - begin);
  for (size_t i = begin; i < end; ++i)
    tokens_.push_back(
        static_cast<std::uint8_t>(vocabulary_.idOf(static_cast<std::uint8_t>(text[i]))));

  // A window needs context + 1 tokens: its inputs and, one further, its last target.
  const auto length = static_cast<std::int64_t>(tokens_.size());
  CHORUS_CHECK_CONFIG(length >= options.context + 1, "text corpus ", source_, ": the ",
                      toString(options.split), " split has ", length,
                      " characters, too few for one window of context ", options.context,
                      " (needs ", options.context + 1, ")");
  windows_ = (length - options.context - 1) / stride_ + 1;
}

Batch TextCorpus::get(const std::vector<std::int64_t>& ids) const {
  checkIds(ids);
  const auto n = static_cast<std::int64_t>(ids.size());
  const std::int64_t context = options_.context;
  at::Tensor inputs = at::empty({n, context}, at::kLong);
  at::Tensor targets = at::empty({n, context}, at::kLong);
  std::int64_t* in = inputs.data_ptr<std::int64_t>();
  std::int64_t* out = targets.data_ptr<std::int64_t>();
  for (std::int64_t row = 0; row < n; ++row) {
    const std::uint8_t* window = tokens_.data() + ids[row] * stride_;
    for (std::int64_t k = 0; k < context; ++k) {
      in[row * context + k] = window[k];
      out[row * context + k] = window[k + 1];
    }
  }
  return Batch{std::move(inputs), std::move(targets)};
}

std::string TextCorpus::name() const {
  // The file name, not the whole path: names appear in every log line about the dataset.
  return std::filesystem::path(source_).filename().string() + "/" + toString(options_.split);
}

std::shared_ptr<TextCorpus> loadTextCorpus(const std::string& path,
                                           const TextCorpusOptions& options) {
  std::error_code error;
  std::ifstream file;
  if (std::filesystem::is_regular_file(path, error)) file.open(path, std::ios::binary);
  if (!file.is_open())
    CHORUS_THROW(ConfigError, "text corpus not found at ", path,
                 ": scripts/setup puts Moby Dick at ", kDefaultTextPath,
                 " (extracted from the Debian package golang-github-colinmarc-hdfs-dev), or "
                 "pass the path of any text file");
  std::ostringstream content;
  content << file.rdbuf();
  if (file.bad()) CHORUS_THROW(ConfigError, "cannot read text corpus ", path);
  return std::make_shared<TextCorpus>(content.str(), options, path);
}

}  // namespace chorus::data
