// planOfWorld: the ranks' devices and hosts, all-gathered, planned as node 0's front end would.
#include "chorus/runtime/train/world_plan.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "chorus/runtime/job/job_plan.h"

namespace chorus::runtime {

plan::Plan planOfWorld(const JobConfig& job, Worker& worker) {
  constexpr int kFields = 5;  // kind, index, speed, budget, host
  const DeviceSpec& mine = worker.identity().device;
  // The host as 52 bits of its id's hash, exact in a double: launchers name hosts differently
  // (chorus's agents "node<k>", mpirun only by hostname), and every one gives them distinct ids.
  constexpr std::uint64_t kHashBits = (std::uint64_t{1} << 52) - 1;
  const auto host =
      static_cast<double>(std::hash<std::string>{}(worker.identity().host_id) & kHashBits);
  const at::Tensor local =
      at::tensor({mine.kind == DeviceKind::kCuda ? 1.0 : 0.0, static_cast<double>(mine.index),
                  mine.speed, static_cast<double>(mine.memory_budget.value_or(0)), host},
                 at::kDouble);
  at::Tensor all = at::empty({kFields * worker.worldSize()}, at::kDouble);
  worker.world()->allGather(local, all).wait();
  const auto values = all.accessor<double, 1>();
  std::vector<DeviceSpec> devices;
  std::vector<std::string> nodes;
  std::vector<double> hosts;  // in order of their first rank: node k is the k-th host met
  for (int rank = 0; rank < worker.worldSize(); ++rank) {
    const double* field = &values[kFields * rank];
    DeviceSpec device;
    device.kind = field[0] > 0 ? DeviceKind::kCuda : DeviceKind::kCpu;
    device.index = static_cast<int>(field[1]);
    device.speed = field[2];
    if (field[3] > 0) device.memory_budget = static_cast<std::uint64_t>(field[3]);
    devices.push_back(device);
    const auto known = std::find(hosts.begin(), hosts.end(), field[4]);
    nodes.push_back("node" + std::to_string(known - hosts.begin()));
    if (known == hosts.end()) hosts.push_back(field[4]);
  }
  return planOfJob(job, devices, nodes);
}

}  // namespace chorus::runtime
