// The elastic membership of a Python worker (python/chorus/elastic.py): chorus's C++
// ElasticMembership (runtime/launch/elastic_membership.h: heartbeats, generations, agreement on
// the lost set, the regrouped world communicator) started for a worker of `chorus run --elastic`,
// with the checks that the job really is elastic and that this worker can take part.
//
// The Python front drives the recovery itself (agree, regroup, hand over the model and optimizer
// from the source, rebuild the DataParallelCore), since the optimizer, the data and the loop are
// the user's; this class is the C++ half it calls. Python's GIL is released around every call
// that waits (the binding's job). Training thread only, except that the membership's monitor runs
// on its own thread from construction to close(). Non-copyable.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chorus/runtime/launch/elastic_membership.h"
#include "chorus/runtime/launch/worker.h"

namespace chorus::python {

struct ElasticSessionOptions {
  // Each worker's heartbeat period, and the missed beats that make a worker lost (a hung or
  // SIGSTOPped process). Defaults: 1 s, 3 (chorus train's elastic.heartbeat_ms, heartbeat_misses).
  std::chrono::milliseconds heartbeat{1000};
  int misses = 3;
};

// Whether `worker` was started by `chorus run --elastic`: its agent published the launch (what a
// joining node reads) in the job's store, which an agent that is not elastic never does.
bool launchedElastic(const runtime::Worker& worker);

class ElasticSession {
 public:
  // Checks that the worker is a launch worker of `chorus run --elastic` (ConfigError otherwise:
  // another launcher, an agent without --elastic, or a replacement that --max-restarts started,
  // which the Python front cannot admit), waits at a barrier of the world so that every rank's
  // monitor starts at the same moment (a peer whose monitor had not started would look hung), and
  // starts the membership. Collective.
  ElasticSession(std::shared_ptr<runtime::Worker> worker, ElasticSessionOptions options);
  ~ElasticSession();
  ElasticSession(const ElasticSession&) = delete;
  ElasticSession& operator=(const ElasticSession&) = delete;

  // The generation this worker is in.
  runtime::Generation current() const;
  // After a failure of this generation (`message`, raised at `file`:`line`; `ranks`: the lost
  // ranks a PeerFailure named, as launch ranks, else empty): the generation every survivor agrees
  // on, with `next_step` this worker's next step (ElasticMembership::agree). Throws CommError
  // when this worker was left out.
  runtime::Generation agree(std::int64_t next_step, const std::string& message,
                            const std::vector<int>& ranks, const std::string& file, int line);
  // Joins `next`'s world communicator; the worker's rank, size and world are then the new ones.
  // Throws CommError (PeerFailure) when a member is lost meanwhile: agree again.
  void regroup(const runtime::Generation& next);
  // True once agree() found this worker left out: it must stop.
  bool leftOut() const;
  // Whether the job has gone past this worker's generation (one store round trip).
  bool superseded() const;
  // Stops the monitor (no more heartbeats); later calls do nothing. At the end of the job, and
  // before the interpreter exits, so that no thread of it outlives the process's teardown.
  void close();
  bool closed() const { return membership_ == nullptr; }

 private:
  runtime::ElasticMembership& membership() const;

  std::shared_ptr<runtime::Worker> worker_;
  std::unique_ptr<runtime::ElasticMembership> membership_;
};

}  // namespace chorus::python
