// chorus._C: the extension module of the Python package (python/chorus/__init__.py imports torch
// first, so that the libtorch this module links is the one already loaded), and the translation
// of chorus::Error and its children into the classes of chorus.errors (a Python module, so that
// they carry the C++ error's fields as attributes: TimeoutError.missing_ranks, ...). Errors that
// are not chorus's keep pybind11's own translation (std::invalid_argument becomes ValueError, and
// so on).
#include <exception>
#include <string>

#include "bindings.h"
#include "chorus/chorus.h"
#include "chorus/core/error.h"

namespace chorus::python {
namespace {

py::list toList(const std::vector<int>& values) {
  py::list list;
  for (int value : values) list.append(value);
  return list;
}

// Raises the chorus.errors class named error.kind(), built with the error's fields.
void raise(const Error& error) {
  py::module_ errors = py::module_::import("chorus.errors");
  py::object type = errors.attr("error_class")(error.kind());
  py::dict fields;
  fields["file"] = error.file() ? error.file() : "";
  fields["line"] = error.line();
  if (const auto* timeout = dynamic_cast<const TimeoutError*>(&error)) {
    fields["operation"] = timeout->operation();
    fields["sequence"] = timeout->sequence();
    fields["missing_ranks"] = toList(timeout->missingRanks());
  } else if (const auto* failure = dynamic_cast<const PeerFailure*>(&error)) {
    fields["ranks"] = toList(failure->ranks());
  }
  py::object instance = type(error.message(), **fields);
  PyErr_SetObject(type.ptr(), instance.ptr());
}

}  // namespace

void bindErrors(py::module_& module) {
  py::register_exception_translator([](std::exception_ptr pointer) {
    if (!pointer) return;
    try {
      std::rethrow_exception(pointer);
    } catch (const Error& error) {
      try {
        raise(error);
      } catch (py::error_already_set& failure) {
        failure.restore();  // chorus.errors itself failed: let that error through
      }
    }
  });
}

}  // namespace chorus::python

PYBIND11_MODULE(_C, module) {
  module.doc() = "chorus's C++ core: communicator, reducer, balancer, sampler (see docs/python.md)";
  module.attr("__version__") = chorus::versionString();
  chorus::python::bindErrors(module);
  chorus::python::bindComm(module);
  chorus::python::bindData(module);
  chorus::python::bindZero(module);
  chorus::python::bindDataParallel(module);
  chorus::python::bindElastic(module);
}
