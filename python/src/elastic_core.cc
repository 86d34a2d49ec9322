// The elastic membership of a Python worker (elastic_core.h).
#include "elastic_core.h"

#include "chorus/core/error.h"

namespace chorus::python {

bool launchedElastic(const runtime::Worker& worker) {
  // Only chorus run's agent sets it (identity.cc refuses it under other launchers).
  return worker.identity().elastic;
}

ElasticSession::ElasticSession(std::shared_ptr<runtime::Worker> worker,
                               ElasticSessionOptions options)
    : worker_(std::move(worker)) {
  CHORUS_CHECK_CONFIG(worker_->identity().launcher == "chorus",
                      "elastic: the workers must be started by `chorus run --elastic`, not by ",
                      worker_->identity().launcher,
                      " (only chorus's agent keeps the others running and reports a lost one)");
  CHORUS_CHECK_CONFIG(!worker_->identity().joins(), "elastic: rank ", worker_->member(),
                      " was started to join the running job (a replacement of `chorus run "
                      "--max-restarts`, or a node of `--join`); the Python front does not admit "
                      "joining workers: run `chorus run --elastic` without --max-restarts");
  CHORUS_CHECK_CONFIG(launchedElastic(*worker_),
                      "elastic: the job was not started by `chorus run --elastic` (its agent "
                      "stops every worker when one fails, so no survivor could go on)");
  CHORUS_CHECK_CONFIG(
      options.heartbeat.count() > 0 && options.misses >= 1,
      "elastic: the heartbeat must be a positive period and misses at least 1, got ",
      options.heartbeat.count(), " ms and ", options.misses);
  runtime::ElasticOptions elastic;
  elastic.heartbeat = options.heartbeat;
  elastic.misses = options.misses;
  // As chorus train: the survivors wait for the absent as long as for a collective.
  elastic.agreement_timeout = std::chrono::milliseconds(worker_->identity().timeout_ms);
  worker_->world()->barrier().wait();
  membership_ = std::make_unique<runtime::ElasticMembership>(worker_, elastic);
}

ElasticSession::~ElasticSession() = default;

runtime::ElasticMembership& ElasticSession::membership() const {
  CHORUS_CHECK_CONFIG(membership_ != nullptr, "elastic: the session was closed");
  return *membership_;
}

runtime::Generation ElasticSession::current() const { return membership().current(); }

runtime::Generation ElasticSession::agree(std::int64_t next_step, const std::string& message,
                                          const std::vector<int>& ranks, const std::string& file,
                                          int line) {
  // The membership declares lost the ranks a PeerFailure names, and leaves a deadline's absent
  // ranks to the heartbeat: the failure keeps its kind, and where it was raised.
  if (!ranks.empty()) {
    const PeerFailure failure(message, file.c_str(), line, ranks);
    return membership().agree(next_step, failure);
  }
  const CommError failure(message, file.c_str(), line);
  return membership().agree(next_step, failure);
}

void ElasticSession::regroup(const runtime::Generation& next) { membership().regroup(next); }

bool ElasticSession::leftOut() const { return membership_ && membership_->leftOut(); }

bool ElasticSession::superseded() const { return membership().superseded(); }

void ElasticSession::close() { membership_.reset(); }

}  // namespace chorus::python
