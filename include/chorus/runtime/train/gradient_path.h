// The path a data-parallel rank's gradients take over the job's devices: where the reducer's
// buckets live and whether a hierarchical all-reduce bridges groups of unlike devices. chorus
// train's data-parallel engine and the Python front's DataParallel choose it here, so a module on
// a GPU reduces the same way from either.
#pragma once

#include <string>

#include "chorus/core/collective_kinds.h"
#include "chorus/parallel/gradient_reducer.h"
#include "chorus/runtime/launch/worker.h"

namespace chorus::runtime {

// Sets `options.device_buckets` and `options.hierarchical` for `algorithm` over the world of
// `worker`, whose ranks are grouped by host and device vendor (collective: every rank sends its
// descriptor once). Under kFlat a world that one native collective spans (all CPU, or one GPU
// per rank of one vendor: NCCL) keeps its buckets on the device, any other (CUDA beside CPU
// ranks, ranks sharing a GPU) in host memory; every other algorithm runs a hierarchical
// all-reduce over the groups, which bridges them through host memory where the devices differ,
// and the buckets stay on the device. Returns what rank 0 should log about it ("" when the
// path is the plain one).
std::string chooseGradientPath(Worker& worker, AllReduceAlgorithm algorithm,
                               parallel::ReducerOptions& options);

}  // namespace chorus::runtime
