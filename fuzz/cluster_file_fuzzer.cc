// Fuzz target: cluster files (`chorus plan --cluster C.toml`, plan/cluster_file.h).
#include "chorus/plan/cluster_file.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace chorus;
  fuzz::quietLogs();
  fuzz::guarded([&] { plan::parseClusterToml(fuzz::asText(data, size), "fuzz-cluster.toml"); });
  return 0;
}
