// Fuzz target: `chorus checkpoint consolidate FILE` on the Python front's checkpoints
// (runtime/checkpoint/python_checkpoint.cc): a file chorus.save wrote, as a user hands it to the
// CLI. Its checksum is written beside it for each input, so every input reaches what follows the
// check: archiveOf's checks of the zip and its pickles, libtorch's unpickler (with no type
// resolver: chorus.save's outer pickle holds only what that reads), and the walk of the model's
// entries into a model.pt. Whatever the bytes, the answer is a model.pt or a CheckpointError;
// libtorch's own errors (c10::Error, torch::jit::ErrorReport) must be translated, never escape.
//
// Input: the file's bytes. Seeds are files chorus.save wrote
// (fuzz/make_python_checkpoint_seeds.py).
#include "checkpoint/checkpoint_files.h"
#include "chorus/runtime/checkpoint/checkpoint.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace chorus;
  fuzz::quietLogs();
  const std::string bytes = fuzz::asText(data, size);
  const std::string file = fuzz::writeScratch("checkpoint.pt", bytes);
  fuzz::writeScratch("checkpoint.pt.sha256", runtime::sha256Hex(bytes) + "\n");
  const std::string out = (fuzz::scratchDir() / "model.pt").string();
  fuzz::guarded([&] { runtime::consolidatePythonCheckpoint(file, out); });
  return 0;
}
