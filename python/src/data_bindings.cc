// The deterministic global sampler and uneven sharding (what ShardSampler is built on), and the
// Fashion-MNIST reader of the C++ side (the examples' data).
#include <numeric>
#include <string>

#include "bindings.h"
#include "chorus/core/error.h"
#include "chorus/data/fashion_mnist.h"
#include "chorus/data/sampler.h"
#include "chorus/data/sharding.h"

namespace chorus::python {
namespace {

void bindSampler(py::module_& module) {
  using data::GlobalSampler;
  py::class_<GlobalSampler>(module, "GlobalSampler",
                            "The ids of each global batch: a pure function of (dataset size, "
                            "global batch, seed, shuffle) and the step")
      .def(py::init<std::int64_t, std::int64_t, std::uint64_t, bool>(), py::arg("dataset_size"),
           py::arg("global_batch"), py::arg("seed") = 0, py::arg("shuffle") = true)
      .def("batch", &GlobalSampler::batch, py::arg("step"))
      .def_property_readonly("batches_per_epoch", &GlobalSampler::batchesPerEpoch)
      .def("epoch_of", &GlobalSampler::epochOf, py::arg("step"))
      .def(
          "state",
          [](const GlobalSampler& self, std::int64_t step) {
            const data::SamplerState state = self.state(step);
            py::dict result;
            result["epoch"] = state.epoch;
            result["position"] = state.position;
            result["step"] = state.step;
            return result;
          },
          py::arg("step"))
      .def(
          "resume",
          [](const GlobalSampler& self, std::int64_t epoch, std::int64_t position,
             std::int64_t step) {
            return self.resume(data::SamplerState{epoch, position, step});
          },
          py::arg("epoch"), py::arg("position"), py::arg("step"));

  module.def("shard_of", &data::shardOf, py::arg("global_ids"), py::arg("shares"), py::arg("rank"),
             "Rank `rank`'s contiguous slice of the global batch under `shares`.");
}

// The whole split as (images float [N,1,28,28] normalized with the dataset's mean and std, labels
// int64 [N]), read by the C++ reader (IDX files of the Debian package dataset-fashion-mnist).
py::tuple fashionMnist(const std::string& split, const std::string& directory) {
  CHORUS_CHECK_CONFIG(split == "train" || split == "test", "unknown Fashion-MNIST split '", split,
                      "': expected train or test");
  data::Batch batch;
  {
    py::gil_scoped_release release;
    auto dataset = data::loadFashionMnist(
        directory, split == "train" ? data::Split::kTrain : data::Split::kTest);
    std::vector<std::int64_t> ids(static_cast<size_t>(dataset->size()));
    std::iota(ids.begin(), ids.end(), 0);
    batch = dataset->get(ids);
  }
  return py::make_tuple(batch.inputs, batch.targets);
}

}  // namespace

void bindData(py::module_& module) {
  bindSampler(module);
  module.def("fashion_mnist", &fashionMnist, py::arg("split") = "train",
             py::arg("directory") = std::string(data::kDefaultFashionMnistDir));
}

}  // namespace chorus::python
