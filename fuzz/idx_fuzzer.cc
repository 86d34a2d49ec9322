// Fuzz target: the IDX reader of Fashion-MNIST (data::loadFashionMnist), plain and gzip.
// Input: the images file, then kSeparator, then the labels file. Both are written to a scratch
// directory under the training split's names (zlib reads plain and gzip data alike); a data set
// that loads must serve its first and last samples.
#include "chorus/data/fashion_mnist.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace chorus;
  fuzz::quietLogs();
  const std::string text = fuzz::asText(data, size);
  fuzz::writeScratch("train-images-idx3-ubyte", fuzz::part(text, 0));
  fuzz::writeScratch("train-labels-idx1-ubyte", fuzz::part(text, 1));
  fuzz::guarded([&] {
    auto dataset = data::loadFashionMnist(fuzz::scratchDir().string(), data::Split::kTrain);
    if (dataset->size() > 0) dataset->get({0, dataset->size() - 1});
  });
  return 0;
}
