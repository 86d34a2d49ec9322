// Counters of bytes and time per kind of communication operation, for metrics.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace chorus::comm {

// Totals for one operation kind. `bytes` is the payload the caller handed in (the tensor's size,
// for uneven operations this rank's contribution), not the bytes on the wire, which depend on the
// algorithm. `seconds` runs from the call until wait() returned.
struct OpStats {
  std::uint64_t count = 0;
  std::uint64_t bytes = 0;
  double seconds = 0.0;
  std::uint64_t failures = 0;
};

// Thread-safe accumulator; one per Communicator.
class CommStats {
 public:
  void record(const std::string& op, std::uint64_t bytes, double seconds, bool failed);
  // A consistent copy of all totals, keyed by operation name.
  std::map<std::string, OpStats> snapshot() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, OpStats> totals_;
};

}  // namespace chorus::comm
