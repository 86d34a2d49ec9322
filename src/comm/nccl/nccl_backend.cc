// The NCCL backend for CUDA tensors (RCCL on ROCm builds of libtorch, which keep the NCCL names).
// Compiled only where libtorch has CUDA and nccl.h exists; used when a collective meets a CUDA
// tensor.
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "../backend.h"
#include "chorus/core/error.h"

namespace chorus::comm {

c10::intrusive_ptr<c10d::Backend> createNcclBackend(const BackendArgs& args) {
  if (!at::globalContext().hasCUDA())
    CHORUS_THROW(CommError, "a CUDA tensor reached the communicator but no CUDA device is usable");
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = args.timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(args.store, args.rank, args.size, options);
}

}  // namespace chorus::comm
