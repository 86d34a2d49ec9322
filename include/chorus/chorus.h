// The public entry point of chorus for a user's own training program started by `chorus run`.
//
//   #include <chorus/chorus.h>
//   int main() {
//     auto worker = chorus::init();              // identity, store, world communicator
//     at::Tensor t = at::full({4}, worker->rank());
//     worker->world()->allReduce(t).wait();      // every wait has a deadline
//   }
//
// Guide to the headers: core/ (errors, device specs, clocks, logging), device/ (discovery,
// emulation, micro-benchmarks), comm/ (store, communicator), runtime/ (identity, worker, agent).
#pragma once

#include "chorus/comm/communicator.h"
#include "chorus/core/device_spec.h"
#include "chorus/core/error.h"
#include "chorus/core/logging.h"
#include "chorus/runtime/launch/identity.h"
#include "chorus/runtime/launch/worker.h"

namespace chorus {

// "0.1.0 (libtorch 2.15.0)".
const char* versionString();

inline std::shared_ptr<runtime::Worker> init(const runtime::InitOptions& options = {}) {
  return runtime::init(options);
}

}  // namespace chorus
