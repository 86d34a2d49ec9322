// chorus._C: the extension module of the Python package (python/chorus/__init__.py imports torch
// first, so that the libtorch this module links is the one already loaded).
#include "bindings.h"

#include "chorus/chorus.h"

PYBIND11_MODULE(_C, module) {
  module.doc() = "chorus's C++ core: communicator, reducer, balancer, sampler (see docs/python.md)";
  module.attr("__version__") = chorus::versionString();
  chorus::python::bindErrors(module);
  chorus::python::bindComm(module);
  chorus::python::bindData(module);
  chorus::python::bindDataParallel(module);
}
