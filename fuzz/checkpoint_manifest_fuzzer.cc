// Fuzz target: a checkpoint's MANIFEST.json and the check of its files (runtime/checkpoint.h), as
// `chorus train --resume` reads a checkpoint that may come from another machine.
// Input: MANIFEST.json, optionally followed by kSeparator and the bytes of a file "a.bin" in the
// same checkpoint (the seeds name it, with its size and SHA-256, so the fuzzer reaches the checks
// past the manifest).
#include <filesystem>

#include "chorus/runtime/checkpoint/checkpoint.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace chorus;
  fuzz::quietLogs();
  const std::string text = fuzz::asText(data, size);
  const std::filesystem::path root = fuzz::scratchDir() / "checkpoints";
  const std::filesystem::path dir = root / "step-00000010";
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(dir);
  fuzz::writeScratch("checkpoints/step-00000010/MANIFEST.json", fuzz::part(text, 0));
  fuzz::writeScratch("checkpoints/step-00000010/a.bin", fuzz::part(text, 1));
  fuzz::writeScratch("checkpoints/latest", "step-00000010\n");
  fuzz::guarded([&] { runtime::verifyCheckpoint(dir.string()); });
  fuzz::guarded([&] { runtime::resolveCheckpoint("latest", root.string()); });
  fuzz::guarded([&] {
    const runtime::Manifest manifest = runtime::readManifest(dir.string());
    for (const auto& entry : manifest.files)
      fuzz::guarded([&] { runtime::readCheckpointFile(dir.string(), manifest, entry.name); });
  });
  return 0;
}
