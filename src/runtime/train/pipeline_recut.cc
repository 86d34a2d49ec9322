// The adaptive cut in the pipeline stage engine: the policy fed after every step, moves (the
// policy's, or a test's through TrainerHooks::cut_at), and a checkpoint's cut taken at resume.
#include "train/pipeline_recut.h"

#include <algorithm>
#include <limits>
#include <sstream>

#include "chorus/core/clock.h"
#include "chorus/core/error.h"
#include "chorus/core/logging.h"
#include "chorus/runtime/job/pipeline_job.h"
#include "train/pipeline_stage_engine.h"

namespace chorus::runtime {
namespace {

parallel::RecutOptions recutOptions(const ParallelSection& parallel) {
  parallel::RecutOptions options;
  options.every = static_cast<int>(
      std::min<std::int64_t>(parallel.recut_every, std::numeric_limits<int>::max()));
  options.threshold = parallel.recut_threshold;
  return options;
}

// A cut every rank can run: S + 1 ascending boundaries from 0 to the model's layers.
void checkCuts(const std::vector<int>& cuts, int stages, int layers, const char* source) {
  bool valid =
      static_cast<int>(cuts.size()) == stages + 1 && cuts.front() == 0 && cuts.back() == layers;
  for (std::size_t s = 0; valid && s + 1 < cuts.size(); ++s) valid = cuts[s] < cuts[s + 1];
  CHORUS_CHECK_CONFIG(valid, "recut: ", source, " gave cuts that do not split ", layers,
                      " layers into ", stages, " non-empty stages");
}

}  // namespace

PipelineRecut::PipelineRecut(PipelineStageEngine& stage, const std::vector<DeviceSpec>& devices,
                             std::shared_ptr<const plan::MemoryModel> memory)
    : s_(stage) {
  const parallel::PipelineLayout layout(s_.options.replicas, s_.options.pipeline_stages);
  request_.profile = s_.model->profile();
  request_.options = s_.options;
  request_.devices = stageDevices(layout, devices);
  request_.memory = std::move(memory);
  if (s_.job.parallel.recut != "adaptive") return;
  checkRecut(s_.job, devices);
  policy_.emplace(request_, s_.stage_cuts, recutOptions(s_.job.parallel));
}

void PipelineRecut::afterStep(std::int64_t step, const TrainerHooks& hooks, StepRecord& record) {
  const int stages = s_.options.pipeline_stages, layers = s_.model->numLayers();
  std::optional<parallel::RecutMove> move;
  std::string measured;
  if (policy_) {
    std::vector<std::int64_t> shares;  // the shares the step ran with, per replica
    for (int r = 0; r < s_.options.replicas; ++r) shares.push_back(record.shares.at(r * stages));
    double step_seconds = 0;  // the same figure on every rank: the slowest rank's busy time
    for (std::size_t k = 0; k < record.compute_seconds.size(); ++k)
      step_seconds = std::max(step_seconds, record.compute_seconds[k] + record.wait_seconds[k]);
    move = policy_->update(step, record.compute_seconds, shares, step_seconds);
    measured = policy_->takeMeasuredGain();
  }
  if (hooks.cut_at) {
    const std::vector<int> forced = hooks.cut_at(step);
    if (!forced.empty() && forced != s_.stage_cuts) {
      checkCuts(forced, stages, layers, "TrainerHooks::cut_at");
      move = parallel::RecutMove{};
      move->step = step;
      move->from = s_.stage_cuts;
      move->to = forced;
      move->reason = "TrainerHooks::cut_at";
    }
  }
  if (move) {
    Stopwatch clock;
    moveTo(move->to);
    if (policy_) policy_->moved(*move);
    std::ostringstream text;
    text << (move->reason == "TrainerHooks::cut_at"
                 ? "after step " + std::to_string(step) + " (" + move->reason + "): cut " +
                       parallel::describeCut(move->from) + " -> " + parallel::describeCut(move->to)
                 : move->describe())
         << "; moved in " << static_cast<int>(clock.seconds() * 1000 + 0.5) << " ms";
    record.recut = text.str();
  }
  if (!measured.empty()) record.recut += (record.recut.empty() ? "" : "; ") + measured;
}

void PipelineRecut::moveTo(const std::vector<int>& cuts) {
  ReceivedStates received = exchangeLayers(s_, s_.stage_cuts, cuts);
  rebuildStage(s_, cuts, std::move(received));
}

void PipelineRecut::adopt(const std::vector<int>& cuts, std::int64_t step) {
  const int stages = s_.options.pipeline_stages, layers = s_.model->numLayers();
  try {
    checkCuts(cuts, stages, layers, "the checkpoint");
  } catch (const ConfigError& error) {
    CHORUS_THROW(CheckpointError, error.message());
  }
  // The checkpoint's cut must fit this job's devices as the start cut had to.
  if (request_.memory) {
    const std::vector<std::int64_t>& shares = s_.options.replica_shares;
    for (int r = 0; r < s_.options.replicas; ++r)
      for (int s = 0; s < stages; ++s) {
        const std::uint64_t budget = request_.devices[r][s].memory_bytes;
        const std::int64_t micro =
            (shares[r] + s_.options.micro_batches - 1) / s_.options.micro_batches;
        if (budget > 0 &&
            request_.memory->peakBytes(parallel::stageMemoryRequest(
                s_.options, layers, s, cuts[s], cuts[s + 1], micro)) > static_cast<double>(budget))
          CHORUS_THROW(CheckpointError, "recut: the checkpoint's cut ", parallel::describeCut(cuts),
                       " does not fit the memory budget of stage ", s, " of replica ", r);
      }
  }
  rebuildStage(s_, cuts, {});
  if (policy_) policy_->reset(cuts, step - 1);
}

}  // namespace chorus::runtime
