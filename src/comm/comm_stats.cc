#include "chorus/comm/comm_stats.h"

namespace chorus::comm {

void CommStats::record(const std::string& op, std::uint64_t bytes, double seconds, bool failed) {
  std::lock_guard<std::mutex> lock(mutex_);
  OpStats& totals = totals_[op];
  ++totals.count;
  totals.bytes += bytes;
  totals.seconds += seconds;
  if (failed) ++totals.failures;
}

std::map<std::string, OpStats> CommStats::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return totals_;
}

}  // namespace chorus::comm
