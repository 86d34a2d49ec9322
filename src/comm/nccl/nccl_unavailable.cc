// Compiled instead of nccl_backend.cc when this build has no NCCL (no CUDA libtorch or no nccl.h).
#include "../backend.h"
#include "chorus/core/error.h"

namespace chorus::comm {

c10::intrusive_ptr<c10d::Backend> createNcclBackend(const BackendArgs&) {
  CHORUS_THROW(CommError,
               "CUDA tensors need the NCCL backend, which this build of chorus does not have "
               "(configure against a CUDA libtorch with nccl.h available)");
}

}  // namespace chorus::comm
