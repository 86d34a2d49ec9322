// Where a data-parallel rank's gradient buckets live, and over which groups they are all-reduced
// (chorus/runtime/train/gradient_path.h).
#include "chorus/runtime/train/gradient_path.h"

#include <ATen/detail/CUDAHooksInterface.h>

#include <memory>
#include <utility>

#include "chorus/comm/hierarchical_all_reduce.h"
#include "chorus/comm/topology.h"
#include "chorus/device/discovery.h"

namespace chorus::runtime {
namespace {

// What this rank tells the others for the gradient topology: its host, its device's vendor and,
// for a GPU, which card (ranks sharing one cannot share a NCCL communicator), by its PCI address:
// tasks given one GPU each all call theirs cuda:0.
comm::RankDescriptor rankDescriptor(const WorkerIdentity& identity) {
  comm::RankDescriptor self;
  self.host_id = identity.host_id;
  if (identity.device.kind == DeviceKind::kCuda) {
    self.vendor = at::detail::getCUDAHooks().hasROCM() ? "amd" : "nvidia";
    self.device = device::physicalGpuId(identity.device.index);
  }
  return self;
}

}  // namespace

std::string chooseGradientPath(Worker& worker, AllReduceAlgorithm algorithm,
                               parallel::ReducerOptions& options) {
  auto topology = comm::Topology::discover(*worker.world(), rankDescriptor(worker.identity()),
                                           comm::GroupBy::kHostAndVendor);
  if (algorithm == AllReduceAlgorithm::kFlat) {
    options.device_buckets = topology.native();
    return topology.native() ? "" : "flat, in host memory (" + topology.describe() + ")";
  }
  options.device_buckets = true;
  comm::HierarchicalOptions hierarchical;
  hierarchical.algorithm = algorithm;
  const std::string described = topology.describe();
  options.hierarchical = std::make_shared<comm::HierarchicalAllReduce>(
      worker.world(), std::move(topology), hierarchical);
  return std::string(toString(algorithm)) + " over " + described +
         " (rank 0: " + options.hierarchical->describeTransports() + ")";
}

}  // namespace chorus::runtime
