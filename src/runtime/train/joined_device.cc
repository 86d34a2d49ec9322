#include "train/joined_device.h"

#include <chrono>

#include "chorus/core/error.h"
#include "chorus/plan/plan_json.h"

namespace chorus::runtime {
namespace {

std::string deviceKey(int member) { return "elastic/device/" + std::to_string(member); }

}  // namespace

void checkNewDeviceJoin(const JobConfig& job, const plan::Plan& launch, const Worker& worker) {
  const std::string who =
      detail::concat("trainer: rank ", worker.member(), " on ", worker.identity().device.toString(),
                     " joins the running job with a new device");
  CHORUS_CHECK_CONFIG(job.elastic.enabled, who, ", but the job is not elastic");
  CHORUS_CHECK_CONFIG(launch.stageCount() == 1, who, ", but the job runs pipelines of ",
                      launch.stageCount(), " stages (only data-parallel jobs regroup)");
  CHORUS_CHECK_CONFIG(job.precision.ranks.empty(), who,
                      ", but precision.ranks names a precision per launch rank only");
}

void postJoinedDevice(const JobConfig& job, Worker& worker) {
  const DeviceSpec& device = worker.identity().device;
  plan::Plan entry;
  entry.global_batch = static_cast<int>(job.train.global_batch);
  plan::RankPlan rank;
  rank.device_type = device.toString();
  rank.spec = device;
  rank.node = worker.identity().host_id;
  rank.precision = plan::parseDtype(precisionOf(job.precision, worker.member(), device));
  entry.ranks.push_back(rank);
  worker.store()->setString(deviceKey(worker.member()), plan::toJson(entry).dump());
}

plan::RankPlan joinedDeviceOf(comm::Store& store, int member) {
  if (!store.check({deviceKey(member)}))
    CHORUS_THROW(CommError, "elastic: rank ", member,
                 " joins with a new device but did not say which");
  const std::string text = store.getString(deviceKey(member), std::chrono::milliseconds(5000));
  return plan::parsePlanJson(text, "the device of joining rank " + std::to_string(member))
      .ranks.at(0);
}

}  // namespace chorus::runtime
