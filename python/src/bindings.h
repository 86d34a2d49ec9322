// The pieces of the extension module chorus._C, one function per binding file, called in this
// order by module.cc. The Python package (python/chorus) wraps them in the API users see
// (docs/python.md); nothing here is meant to be imported directly.
//
// The GIL is released around everything that can block (rendezvous, waits, padding sleeps), and
// never held by code that runs inside autograd's backward: the reducer's hooks are C++ only.
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace chorus::python {

namespace py = pybind11;

// Translates chorus::Error and its children into the classes of chorus.errors (module.cc).
void bindErrors(py::module_& module);
// Worker (chorus::init), Communicator and Work (comm_bindings.cc).
void bindComm(py::module_& module);
// GlobalSampler, shardOf and the Fashion-MNIST loader (data_bindings.cc).
void bindData(py::module_& module);
// DataParallelCore: reducer, compute phases, step figures, balancer (step_bindings.cc).
void bindDataParallel(py::module_& module);
// ZeroCore: ZeRO's slice of a DataParallelCore (step_bindings.cc). Before bindDataParallel.
void bindZero(py::module_& module);
// ElasticSession and Generation: the elastic membership (elastic_bindings.cc).
void bindElastic(py::module_& module);

}  // namespace chorus::python
