// DataParallelCore for Python (chorus.DataParallel and chorus.step call it), and the balancer's
// state as a plain dict of lists for chorus's checkpoint helpers.
#include <string>

#include "bindings.h"
#include "chorus/core/error.h"
#include "data_parallel_core.h"

namespace chorus::python {
namespace {

py::dict stateToDict(const plan::BalancerState& state) {
  py::dict d;
  d["shares"] = state.shares;
  d["steps_observed"] = state.steps_observed;
  d["last_change_step"] = state.last_change_step;
  d["static_done"] = state.static_done;
  d["observation_rank"] = state.observation_rank;
  d["observation_samples"] = state.observation_samples;
  d["observation_seconds"] = state.observation_seconds;
  d["held_rank"] = state.held_rank;
  d["held_samples"] = state.held_samples;
  d["held_seconds"] = state.held_seconds;
  d["held_ratio"] = state.held_ratio;
  d["fixed_seconds"] = state.fixed_seconds;
  d["last_change"] = state.last_change;
  d["small_gain_updates"] = state.small_gain_updates;
  d["small_gain_direction"] = state.small_gain_direction;
  return d;
}

template <typename T>
void take(const py::dict& d, const char* key, T& into) {
  if (!d.contains(key))
    CHORUS_THROW(CheckpointError, "chorus balancer state: missing entry '", key, "'");
  try {
    into = d[key].cast<T>();
  } catch (const py::cast_error&) {
    CHORUS_THROW(CheckpointError, "chorus balancer state: entry '", key, "' has the wrong type");
  }
}

plan::BalancerState stateFromDict(const py::dict& d) {
  plan::BalancerState state;
  take(d, "shares", state.shares);
  take(d, "steps_observed", state.steps_observed);
  take(d, "last_change_step", state.last_change_step);
  take(d, "static_done", state.static_done);
  take(d, "observation_rank", state.observation_rank);
  take(d, "observation_samples", state.observation_samples);
  take(d, "observation_seconds", state.observation_seconds);
  take(d, "held_rank", state.held_rank);
  take(d, "held_samples", state.held_samples);
  take(d, "held_seconds", state.held_seconds);
  take(d, "held_ratio", state.held_ratio);
  take(d, "fixed_seconds", state.fixed_seconds);
  take(d, "last_change", state.last_change);
  take(d, "small_gain_updates", state.small_gain_updates);
  take(d, "small_gain_direction", state.small_gain_direction);
  return state;
}

py::dict figuresToDict(const StepFigures& figures) {
  py::dict d;
  d["step"] = figures.step;
  d["loss"] = figures.loss;
  d["overflow"] = figures.overflow;
  d["compute_seconds"] = figures.compute_seconds;
  d["wait_seconds"] = figures.wait_seconds;
  d["samples"] = figures.samples;
  d["shares"] = figures.next_shares;
  d["rebalance"] = figures.rebalance;
  return d;
}

}  // namespace

void bindDataParallel(py::module_& module) {
  py::class_<DataParallelCore>(module, "DataParallelCore")
      .def(py::init([](std::shared_ptr<runtime::Worker> worker, std::vector<at::Tensor> parameters,
                       std::int64_t global_batch, const std::string& balance,
                       std::vector<std::int64_t> shares, double bucket_cap_mb, bool overlap) {
             DataParallelOptions options;
             options.global_batch = global_batch;
             options.balance = balance;
             options.shares = std::move(shares);
             options.bucket_cap_mb = bucket_cap_mb;
             options.overlap = overlap;
             py::gil_scoped_release release;
             return std::make_unique<DataParallelCore>(std::move(worker), std::move(parameters),
                                                       options);
           }),
           py::arg("worker"), py::arg("parameters"), py::arg("global_batch"),
           py::arg("balance") = "adaptive", py::arg("shares") = std::vector<std::int64_t>{},
           py::arg("bucket_cap_mb") = 25.0, py::arg("overlap") = true)
      .def("broadcast_from_rank_zero", &DataParallelCore::broadcastFromRankZero,
           py::call_guard<py::gil_scoped_release>())
      .def("begin_forward", &DataParallelCore::beginForward, py::arg("arm"), py::arg("samples"),
           py::call_guard<py::gil_scoped_release>())
      .def("synchronize", &DataParallelCore::synchronize, py::call_guard<py::gil_scoped_release>())
      .def("gradients_finite", &DataParallelCore::gradientsFinite)
      .def(
          "finish_step",
          [](DataParallelCore& self, double loss_sum, bool overflow, std::int64_t samples) {
            StepFigures figures;
            {
              py::gil_scoped_release release;
              figures = self.finishStep(loss_sum, overflow, samples);
            }
            return figuresToDict(figures);
          },
          py::arg("loss_sum") = 0.0, py::arg("overflow") = false, py::arg("samples") = -1)
      .def_property_readonly("shares", &DataParallelCore::shares)
      .def_property_readonly("local_share", &DataParallelCore::localShare)
      .def_property_readonly("step", &DataParallelCore::step)
      .def_property_readonly("global_batch", &DataParallelCore::globalBatch)
      .def_property_readonly("num_buckets", &DataParallelCore::numBuckets)
      .def("balancer_state",
           [](const DataParallelCore& self) { return stateToDict(self.balancerState()); })
      .def(
          "restore",
          [](DataParallelCore& self, const py::dict& state, std::int64_t step) {
            self.restore(stateFromDict(state), step);
          },
          py::arg("balancer_state"), py::arg("step"));
}

}  // namespace chorus::python
