// The elastic membership for Python (chorus._C.ElasticSession, Generation): the C++ half of
// python/chorus/elastic.py. Every call that waits for other workers or the store releases the GIL,
// so that the Python side's other threads (a DataLoader's pin-memory thread) go on meanwhile.
#include <chrono>

#include "bindings.h"
#include "elastic_core.h"

namespace chorus::python {

void bindElastic(py::module_& module) {
  using runtime::Generation;
  py::class_<Generation>(module, "Generation",
                         "One generation of an elastic job's membership, as its members agreed "
                         "on it (runtime/launch/elastic_membership.h)")
      .def_readonly("number", &Generation::number)
      .def_readonly("members", &Generation::members,
                    "launch ranks of the members; rank r of the generation is members[r]")
      .def_readonly("source", &Generation::source,
                    "the member whose state the generation starts from (the furthest)")
      .def_readonly("step", &Generation::step, "the step the generation goes on from")
      .def_readonly("lost", &Generation::lost)
      .def_readonly("reason", &Generation::reason)
      .def("rank_of", &Generation::rankOf, py::arg("member"))
      .def("__repr__", &Generation::toJson);

  py::class_<ElasticSession>(module, "ElasticSession")
      .def(py::init([](std::shared_ptr<runtime::Worker> worker, double heartbeat, int misses) {
             ElasticSessionOptions options;
             options.heartbeat =
                 std::chrono::milliseconds(static_cast<long long>(heartbeat * 1000));
             options.misses = misses;
             py::gil_scoped_release release;
             return std::make_unique<ElasticSession>(std::move(worker), options);
           }),
           py::arg("worker"), py::arg("heartbeat") = 1.0, py::arg("misses") = 3,
           "Starts the membership of a worker of `chorus run --elastic` (collective: a barrier)")
      .def("current", &ElasticSession::current)
      .def("agree", &ElasticSession::agree, py::arg("next_step"), py::arg("message"),
           py::arg("ranks"), py::arg("file"), py::arg("line"),
           py::call_guard<py::gil_scoped_release>())
      .def("regroup", &ElasticSession::regroup, py::arg("generation"),
           py::call_guard<py::gil_scoped_release>())
      .def("superseded", &ElasticSession::superseded, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("left_out", &ElasticSession::leftOut)
      .def_property_readonly("closed", &ElasticSession::closed)
      .def("close", &ElasticSession::close, py::call_guard<py::gil_scoped_release>());

  module.def(
      "launched_elastic",
      [](const runtime::Worker& worker) {
        py::gil_scoped_release release;
        return launchedElastic(worker);
      },
      py::arg("worker"), "Whether the worker was started by `chorus run --elastic`");
}

}  // namespace chorus::python
