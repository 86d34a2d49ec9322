// Private to comm: the element-wise reductions of the shared-memory transport.
//
// One plain loop per (type, operation), instantiated from templates so the compiler vectorizes
// it: no per-element dispatch. Half-precision types are widened to float, reduced, and rounded
// once, so a sum of n half values is rounded once rather than n-1 times.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstddef>

#include "chorus/comm/communicator.h"

namespace chorus::comm {

// Whether the shm transport reduces `type` itself (float32/64, bfloat16, float16, int32, int64);
// other types fall back to Gloo.
bool shmReducible(c10::ScalarType type);

// dst[i] = sources[0][i] (op) sources[1][i] (op) ... (op) sources[n-1][i], in rank order, for
// `count` elements of `type`; kAvg divides the sum by n. `copy`, when not null, receives the same
// result in the same pass. `dst` may be one of the sources exactly (in place) when `copy` is
// given; `copy` must not overlap any source.
// REQUIRES: shmReducible(type), n >= 1.
void shmReduce(c10::ScalarType type, ReduceOp op, const void* const* sources, int n, void* dst,
               void* copy, std::size_t count);

}  // namespace chorus::comm
