// Fuzz target: the text reader (data::loadTextCorpus) with its options. Input: two option bytes
// (context 1..64; stride 0..15 and split), then the document. A corpus that loads must serve its
// first and last windows.
#include "chorus/data/text_corpus.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace chorus;
  fuzz::quietLogs();
  if (size < 2) return 0;
  data::TextCorpusOptions options;
  options.context = 1 + data[0] % 64;
  options.stride = data[1] % 16;
  options.split = data[1] & 0x80 ? data::Split::kTest : data::Split::kTrain;
  options.test_fraction = 0.05 + 0.1 * ((data[1] >> 4) & 7);
  const std::string path = fuzz::writeScratch("corpus.txt", fuzz::asText(data + 2, size - 2));
  fuzz::guarded([&] {
    auto corpus = data::loadTextCorpus(path, options);
    if (corpus->size() > 0) corpus->get({0, corpus->size() - 1});
  });
  return 0;
}
