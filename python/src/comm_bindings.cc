// The worker (chorus::init) and the communicator with deadlines, for Python.
//
// Every blocking call releases the GIL. A Work keeps the tensors of its operation alive until it
// is waited for or dropped, as c10d's Python works do.
#include <chrono>
#include <map>
#include <optional>
#include <string>

#include "bindings.h"
#include "chorus/chorus.h"
#include "chorus/device/speed_emulator.h"

namespace chorus::python {
namespace {

comm::ReduceOp parseOp(const std::string& name) {
  if (name == "sum") return comm::ReduceOp::kSum;
  if (name == "avg") return comm::ReduceOp::kAvg;
  if (name == "max") return comm::ReduceOp::kMax;
  if (name == "min") return comm::ReduceOp::kMin;
  CHORUS_THROW(ConfigError, "unknown reduce op '", name, "': expected sum, avg, max or min");
}

// Per-call options from Python's (timeout seconds or None, tag).
comm::OpOptions opOptions(std::optional<double> timeout, int tag = 0) {
  comm::OpOptions options;
  if (timeout) {
    CHORUS_CHECK_CONFIG(*timeout > 0, "timeout must be positive seconds, got ", *timeout);
    options.timeout = std::chrono::milliseconds(static_cast<long long>(*timeout * 1000 + 0.5));
  }
  options.tag = tag;
  return options;
}

std::vector<std::int64_t> counts(const std::vector<std::int64_t>& values) { return values; }

using CommPtr = std::shared_ptr<comm::Communicator>;

void bindWork(py::module_& module) {
  py::class_<comm::Work>(module, "Work",
                         "The handle of an asynchronous collective; wait() raises TimeoutError "
                         "(naming the ranks that did not arrive) or PeerFailure.")
      .def("wait", &comm::Work::wait, py::call_guard<py::gil_scoped_release>())
      .def("is_completed", &comm::Work::isCompleted)
      .def_property_readonly("operation", &comm::Work::operation)
      .def_property_readonly("sequence", &comm::Work::sequence);
}

void bindCommunicator(py::module_& module) {
  // keep_alive<0, 2>: the returned Work keeps the tensor argument alive.
  py::class_<comm::Communicator, CommPtr>(module, "Communicator")
      .def_property_readonly("rank", &comm::Communicator::rank)
      .def_property_readonly("size", &comm::Communicator::size)
      .def_property_readonly("name", &comm::Communicator::name)
      .def_property_readonly("cpu_transport", &comm::Communicator::cpuTransport)
      .def_property_readonly("broken", &comm::Communicator::broken)
      .def(
          "all_reduce",
          [](comm::Communicator& self, at::Tensor tensor, const std::string& op,
             std::optional<double> timeout) {
            return self.allReduce(tensor, parseOp(op), opOptions(timeout));
          },
          py::arg("tensor"), py::arg("op") = "sum", py::arg("timeout") = py::none(),
          py::keep_alive<0, 2>(), py::call_guard<py::gil_scoped_release>())
      .def(
          "broadcast",
          [](comm::Communicator& self, at::Tensor tensor, int root, std::optional<double> timeout) {
            return self.broadcast(tensor, root, opOptions(timeout));
          },
          py::arg("tensor"), py::arg("root"), py::arg("timeout") = py::none(),
          py::keep_alive<0, 2>(), py::call_guard<py::gil_scoped_release>())
      .def(
          "all_gather",
          [](comm::Communicator& self, const at::Tensor& input, at::Tensor output,
             std::optional<double> timeout) {
            return self.allGather(input, output, opOptions(timeout));
          },
          py::arg("input"), py::arg("output"), py::arg("timeout") = py::none(),
          py::keep_alive<0, 2>(), py::keep_alive<0, 3>(), py::call_guard<py::gil_scoped_release>())
      .def(
          "all_gather_v",
          [](comm::Communicator& self, const at::Tensor& input, at::Tensor output,
             const std::vector<std::int64_t>& sizes, std::optional<double> timeout) {
            return self.allGatherV(input, output, counts(sizes), opOptions(timeout));
          },
          py::arg("input"), py::arg("output"), py::arg("counts"), py::arg("timeout") = py::none(),
          py::keep_alive<0, 2>(), py::keep_alive<0, 3>(), py::call_guard<py::gil_scoped_release>())
      .def(
          "reduce_scatter",
          [](comm::Communicator& self, const at::Tensor& input, at::Tensor output,
             const std::string& op, std::optional<double> timeout) {
            return self.reduceScatter(input, output, parseOp(op), opOptions(timeout));
          },
          py::arg("input"), py::arg("output"), py::arg("op") = "sum",
          py::arg("timeout") = py::none(), py::keep_alive<0, 2>(), py::keep_alive<0, 3>(),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "send",
          [](comm::Communicator& self, const at::Tensor& tensor, int dst,
             std::optional<double> timeout,
             int tag) { return self.send(tensor, dst, opOptions(timeout, tag)); },
          py::arg("tensor"), py::arg("dst"), py::arg("timeout") = py::none(), py::arg("tag") = 0,
          py::keep_alive<0, 2>(), py::call_guard<py::gil_scoped_release>())
      .def(
          "recv",
          [](comm::Communicator& self, at::Tensor tensor, int src, std::optional<double> timeout,
             int tag) { return self.recv(tensor, src, opOptions(timeout, tag)); },
          py::arg("tensor"), py::arg("src"), py::arg("timeout") = py::none(), py::arg("tag") = 0,
          py::keep_alive<0, 2>(), py::call_guard<py::gil_scoped_release>())
      .def(
          "barrier",
          [](comm::Communicator& self, std::optional<double> timeout) {
            return self.barrier(opOptions(timeout));
          },
          py::arg("timeout") = py::none(), py::call_guard<py::gil_scoped_release>())
      .def("subgroup", &comm::Communicator::subgroup, py::arg("ranks"), py::arg("name"),
           py::call_guard<py::gil_scoped_release>())
      .def("stats", [](const comm::Communicator& self) {
        py::dict result;
        for (const auto& [name, stats] : self.stats()) {
          py::dict entry;
          entry["count"] = stats.count;
          entry["bytes"] = stats.bytes;
          entry["seconds"] = stats.seconds;
          entry["failures"] = stats.failures;
          result[py::str(name)] = entry;
        }
        return result;
      });
}

void bindWorker(py::module_& module) {
  using runtime::Worker;
  py::class_<Worker, std::shared_ptr<Worker>>(
      module, "Worker", "This process's identity, store, world communicator and device emulation")
      .def_property_readonly("rank", &Worker::rank)
      .def_property_readonly("world_size", &Worker::worldSize)
      .def_property_readonly("member", &Worker::member,
                             "the rank it was launched as (its rank changes in elastic recovery)")
      .def_property_readonly("joins", [](const Worker& self) { return self.identity().joins(); })
      .def_property_readonly("local_rank",
                             [](const Worker& self) { return self.identity().local_rank; })
      .def_property_readonly("local_world_size",
                             [](const Worker& self) { return self.identity().local_world_size; })
      .def_property_readonly("node_rank",
                             [](const Worker& self) { return self.identity().node_rank; })
      .def_property_readonly("launcher",
                             [](const Worker& self) { return self.identity().launcher; })
      .def_property_readonly("device_spec",
                             [](const Worker& self) { return self.identity().device.toString(); })
      .def_property_readonly("device", [](const Worker& self) { return self.device().str(); })
      .def_property_readonly("speed", [](const Worker& self) { return self.emulator().speed(); })
      .def_property_readonly("timeout",
                             [](const Worker& self) { return self.identity().timeout_ms / 1000.0; })
      .def_property_readonly("world", &Worker::world)
      .def("emulation_totals", [](const Worker& self) {
        const device::EmulationTotals totals = self.emulator().totals();
        py::dict result;
        result["compute_seconds"] = totals.compute_seconds;
        result["padded_seconds"] = totals.padded_seconds;
        result["phases"] = totals.phases;
        result["pad_points"] = totals.pad_points;
        return result;
      });

  module.def(
      "init",
      [](std::optional<std::map<std::string, std::string>> environment, bool single_thread) {
        runtime::InitOptions options;
        options.environment = std::move(environment);
        options.single_thread = single_thread;
        py::gil_scoped_release release;
        return runtime::init(options);
      },
      py::arg("environment") = py::none(), py::arg("single_thread") = true,
      "Reads the identity (chorus run, mpirun, srun, or a job of one), connects to the job's "
      "store and joins the world communicator.");
}

}  // namespace

void bindComm(py::module_& module) {
  bindWork(module);
  bindCommunicator(module);
  bindWorker(module);
}

}  // namespace chorus::python
