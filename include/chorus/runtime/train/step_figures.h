// The one exchange of a step's per-rank figures (docs/architecture.md, "One step protocol"): every
// engine — data parallelism, pipeline stages, the Python front — ends its step by all-gathering
// the same few numbers of every rank, so that every rank decides alike whether the step is
// skipped (an overflow anywhere), whether the job stops, what the step's loss is, what the
// balancer is fed and what the log shows.
#pragma once

#include <cstdint>
#include <vector>

#include "chorus/comm/communicator.h"

namespace chorus::runtime {

// What one rank reports of its step. Value type.
struct RankFigures {
  double compute_seconds = 0;  // as its (emulated) device took them
  double wait_seconds = 0;     // blocked in communication
  double loss_sum = 0;         // Σ of its samples' losses; 0 where it computes none
  bool overflow = false;       // its gradients (or its loss scaler) saw a non-finite value
  bool stop = false;           // it was asked to stop (a signal)
  double loss_scale = 0;       // its fp16 loss scale; 0 without one
  double balance = 0;          // what it reports to the balancer (seconds for its share)
  std::int64_t samples = 0;    // samples it took this step
};

// Every rank's figures of one step, the same on every rank. Value type.
class StepFigures {
 public:
  explicit StepFigures(std::vector<RankFigures> ranks) : ranks_(std::move(ranks)) {}

  // All-gathers `mine` over `world` (one small collective; ranks in world order). A world of one
  // exchanges nothing unless `always`: an elastic lone survivor learns of a joining worker when
  // this collective is aborted. Throws CommError as the all-gather does.
  static StepFigures exchange(comm::Communicator& world, const RankFigures& mine,
                              bool always = false);

  const std::vector<RankFigures>& ranks() const { return ranks_; }
  bool anyOverflow() const;
  bool anyStop() const;
  double lossSum() const;
  std::int64_t totalSamples() const;
  std::vector<double> computeSeconds() const;
  std::vector<double> waitSeconds() const;
  std::vector<double> lossScales() const;
  std::vector<double> balance() const;
  std::vector<std::int64_t> samples() const;

 private:
  std::vector<RankFigures> ranks_;
};

}  // namespace chorus::runtime
