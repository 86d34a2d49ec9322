// The Gloo backend for CPU tensors. This is the only file compiled against gloo's headers (the
// torch wheel ships ProcessGroupGloo.hpp without them; see cmake/ChorusTorch.cmake): it touches
// libtorch's out-of-line entry points only, and gloo types only by pointer.
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "backend.h"

namespace chorus::comm {

c10::intrusive_ptr<c10d::Backend> createGlooBackend(const BackendArgs& args) {
  auto options = c10d::ProcessGroupGloo::Options::create(args.timeout);
  options->devices.push_back(
      c10d::ProcessGroupGloo::createDeviceForHostname(args.bind_address, /*lazyInit=*/false));
  // One transport thread: a worker drives one device and one intra-op thread
  // (docs/architecture.md, "Process model").
  options->threads = 1;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(args.store, args.rank, args.size, options);
}

}  // namespace chorus::comm
