// DataParallelCore for Python (chorus.DataParallel and chorus.step call it), its ZeroCore
// (python/chorus/zero.py: the slice's layout, master copy and gradient for the user's optimizer),
// and the balancer's state as a plain dict of lists for chorus's checkpoint helpers.
#include <map>
#include <optional>
#include <string>

#include "bindings.h"
#include "chorus/core/error.h"
#include "chorus/observe/run_observe.h"
#include "chorus/runtime/launch/identity.h"
#include "chorus/runtime/launch/job_observation.h"
#include "data_parallel_core.h"
#include "zero_core.h"

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

void bindZero(py::module_& module) {
  py::class_<ZeroCore>(module, "ZeroCore",
                       "ZeRO's half of a DataParallelCore (DataParallelCore.zero); not made "
                       "directly")
      .def_property_readonly("stage", &ZeroCore::stage)
      .def_property_readonly("fractions", &ZeroCore::fractions)
      .def_property_readonly("bounds", &ZeroCore::bounds)
      .def_property_readonly("order", &ZeroCore::order)
      .def_property_readonly("gathered", &ZeroCore::gathered)
      .def(
          "pieces",
          [](const ZeroCore& self) {
            py::list pieces;
            for (const SlicePiece& piece : self.pieces())
              pieces.append(py::make_tuple(piece.parameter, piece.offset, piece.at, piece.count));
            return pieces;
          },
          "(parameter index, offset in it, offset in the slice, elements) of each parameter "
          "that overlaps this rank's slice, in the flat order")
      .def("master_slice", &ZeroCore::masterSlice)
      .def("gradient_slice", &ZeroCore::gradientSlice)
      .def("start", &ZeroCore::start, py::call_guard<py::gil_scoped_release>())
      .def("gather", &ZeroCore::gather, py::call_guard<py::gil_scoped_release>())
      .def("release", &ZeroCore::release, py::call_guard<py::gil_scoped_release>())
      .def("gather_parameters", &ZeroCore::gatherParameters,
           py::call_guard<py::gil_scoped_release>())
      .def("load_master_from_parameters", &ZeroCore::loadMasterFromParameters,
           py::call_guard<py::gil_scoped_release>());
}

void bindDataParallel(py::module_& module) {
  py::class_<observe::ObserveRequest>(module, "ObserveRequest",
                                      "What `chorus run --metrics-port/--trace` asks of this "
                                      "worker (observe_request())")
      .def(py::init<>())
      .def_readonly("metrics_socket", &observe::ObserveRequest::metrics_socket)
      .def_readonly("trace", &observe::ObserveRequest::trace)
      .def_readonly("metrics_port", &observe::ObserveRequest::metrics_port)
      .def_readonly("node", &observe::ObserveRequest::node)
      .def_property_readonly("any", &observe::ObserveRequest::any);
  py::class_<runtime::JobObservation>(
      module, "JobObservation",
      "CHORUS_METRICS_PORT / CHORUS_TRACE under mpirun, srun, torchrun or no launcher: the node's "
      "first rank serves the node's metrics, rank 0 merges the trace (job_observation.h)")
      .def_property_readonly("request", &runtime::JobObservation::request)
      .def_property_readonly("port",
                             [](const runtime::JobObservation& self) {
                               return self.monitor() ? self.monitor()->port() : -1;
                             })
      .def("finish", &runtime::JobObservation::finish, py::call_guard<py::gil_scoped_release>());
  module.def(
      "observe_job",
      [](std::shared_ptr<runtime::Worker> worker,
         const observe::ObserveRequest& request) -> std::unique_ptr<runtime::JobObservation> {
        if (!runtime::servedByJob(*worker, request)) return nullptr;
        py::gil_scoped_release release;
        return std::make_unique<runtime::JobObservation>(std::move(worker), request);
      },
      py::arg("worker"), py::arg("request"),
      "A JobObservation when the request is the job's own to serve (no chorus agent started "
      "this worker), else None; collective over the job's store");
  module.def(
      "observe_request",
      [](std::optional<std::map<std::string, std::string>> environment) {
        // chorus.init's one reading of the environment (or the given one, for tests).
        const runtime::Environment values =
            environment ? *environment : runtime::processEnvironment();
        return observe::observeRequestFromEnvironment(values, runtime::launcherOf(values));
      },
      py::arg("environment") = py::none(),
      "What chorus run's agent asks this worker to report (CHORUS_METRICS_SOCKET) and trace "
      "(CHORUS_TRACE, CHORUS_TRACE_STEPS), or, under another launcher, what the user asks "
      "(CHORUS_METRICS_PORT, CHORUS_TRACE, CHORUS_TRACE_STEPS); ConfigError for the agent's "
      "socket under another launcher and CHORUS_METRICS_PORT under chorus run");
  py::class_<DataParallelCore>(module, "DataParallelCore")
      .def(py::init([](std::shared_ptr<runtime::Worker> worker, std::vector<at::Tensor> parameters,
                       std::int64_t global_batch, const std::string& balance,
                       std::vector<std::int64_t> shares, double bucket_cap_mb, bool overlap,
                       int zero, const std::string& shards, std::vector<double> fractions,
                       const observe::ObserveRequest& observe, const std::string& algorithm) {
             DataParallelOptions options;
             options.global_batch = global_batch;
             options.balance = balance;
             options.shares = std::move(shares);
             options.bucket_cap_mb = bucket_cap_mb;
             options.overlap = overlap;
             options.zero.stage = zero;
             options.zero.shards = shards;
             options.zero.fractions = std::move(fractions);
             options.observe = observe;
             options.algorithm = parseAllReduceAlgorithm(algorithm);
             py::gil_scoped_release release;
             return std::make_unique<DataParallelCore>(std::move(worker), std::move(parameters),
                                                       options);
           }),
           py::arg("worker"), py::arg("parameters"), py::arg("global_batch"),
           py::arg("balance") = "adaptive", py::arg("shares") = std::vector<std::int64_t>{},
           py::arg("bucket_cap_mb") = 25.0, py::arg("overlap") = true, py::arg("zero") = 0,
           py::arg("shards") = "memory", py::arg("fractions") = std::vector<double>{},
           py::arg("observe") = observe::ObserveRequest{}, py::arg("algorithm") = "flat")
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
      .def("end_forward", &DataParallelCore::endForward)
      .def("end_step", &DataParallelCore::endStep, py::arg("lr") = 0.0, py::arg("loss_scale") = 0.0,
           py::arg("loss_known") = false)
      .def("note_recovery", &DataParallelCore::noteRecovery, py::arg("generation"),
           py::arg("agree_seconds"), py::arg("rebuild_seconds"), py::arg("lost"))
      .def("flush_observation", &DataParallelCore::flushObservation)
      .def_property_readonly("observing", &DataParallelCore::observing)
      .def_property_readonly("shares", &DataParallelCore::shares)
      .def_property_readonly("local_share", &DataParallelCore::localShare)
      .def_property_readonly("step", &DataParallelCore::step)
      .def_property_readonly("global_batch", &DataParallelCore::globalBatch)
      .def_property_readonly("num_buckets", &DataParallelCore::numBuckets)
      .def_property_readonly("zero", &DataParallelCore::zero,
                             py::return_value_policy::reference_internal)
      .def("balancer_state",
           [](const DataParallelCore& self) { return stateToDict(self.balancerState()); })
      .def(
          "restore",
          [](DataParallelCore& self, const py::dict& state, std::int64_t step) {
            self.restore(stateFromDict(state), step);
          },
          py::arg("balancer_state"), py::arg("step"))
      .def(
          "survivor_balancer_state",
          [](const DataParallelCore& self, const std::vector<int>& kept) {
            return stateToDict(self.survivorBalancerState(kept));
          },
          py::arg("kept"))
      .def(
          "regroup",
          [](DataParallelCore& self, const py::dict& state, std::int64_t step) {
            self.regroup(stateFromDict(state), step);
          },
          py::arg("balancer_state"), py::arg("step"));
}

}  // namespace chorus::python
