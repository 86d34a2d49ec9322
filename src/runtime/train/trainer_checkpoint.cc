// The executor's checkpoints, for every plan: when one is written (periodic, final, requested;
// in the background in async mode), trainer.json with what every plan records, and the checks a
// resume makes before the step engine restores this rank's state.
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_archive.h"
#include "chorus/core/error.h"
#include "chorus/core/logging.h"
#include "train/trainer_state.h"

namespace chorus::runtime {
namespace {

constexpr const char* kTrainerFile = "trainer.json";

// What every plan records (rank 0 writes it), with the engine's entries: its layout and its
// balancer's state.
nlohmann::json trainerJson(const Trainer::State& s) {
  const TrainingContext& c = *s.context;
  nlohmann::json json = {
      {"step", s.next_step},          {"world_size", c.worker->worldSize()},
      {"seed", c.job.seed},           {"global_batch", c.job.train.global_batch},
      {"model", c.model->describe()}, {"sampler", samplerJson(*c.sampler, s.next_step)},
      {"config", c.job.toml}};
  json.update(s.engine->checkpointEntries());
  return json;
}

// The checkpoint must come from the same training problem; whether its layout fits is the
// engine's to say.
void checkSameProblem(const TrainingContext& c, const CheckpointSource& source) {
  const nlohmann::json& saved = source.saved;
  if (saved.at("seed").get<std::uint64_t>() != c.job.seed)
    source.mismatch("seed", std::to_string(saved.at("seed").get<std::uint64_t>()),
                    std::to_string(c.job.seed));
  if (saved.at("global_batch").get<std::int64_t>() != c.job.train.global_batch)
    source.mismatch("train.global_batch",
                    std::to_string(saved.at("global_batch").get<std::int64_t>()),
                    std::to_string(c.job.train.global_batch));
  if (saved.at("model").get<std::string>() != c.model->describe())
    source.mismatch("the model", saved.at("model").get<std::string>(), c.model->describe());
}

CheckpointSnapshot snapshotOf(Trainer::State& s) {
  CheckpointSnapshot snapshot = s.engine->snapshot();
  if (s.context->worker->rank() == 0)
    snapshot.small.insert(snapshot.small.begin(), {kTrainerFile, trainerJson(s).dump(1) + "\n"});
  return snapshot;
}

}  // namespace

void CheckpointSource::mismatch(const std::string& what, const std::string& then,
                                const std::string& now) const {
  CHORUS_THROW(CheckpointError, "checkpoint '", dir, "' is of another job: ", what, " was ", then,
               ", the config says ", now);
}

std::string Trainer::checkpoint() {
  State& s = *state_;
  if (!s.checkpoints)
    CHORUS_THROW(ConfigError, "no checkpoint directory: set checkpoint.dir to write checkpoints");
  finishPendingCheckpoint(s);  // one write in flight at a time
  s.last_checkpoint_step = s.next_step;
  s.last_checkpoint_path = s.checkpoints->write(s.next_step, snapshotOf(s).files());
  return s.last_checkpoint_path;
}

void restoreCheckpoint(Trainer::State& s, const std::string& checkpoint_dir) {
  TrainingContext& c = *s.context;
  translateRestoreErrors(checkpoint_dir, [&] {
    CheckpointSource source{checkpoint_dir, readManifest(checkpoint_dir), {}};
    source.saved = nlohmann::json::parse(source.read(kTrainerFile));
    checkSameProblem(c, source);
    s.engine->restore(source);
    s.next_step = resumeSampler(*c.sampler, source.saved.at("sampler"));
    s.last_checkpoint_step = s.next_step;
  });
}

void Trainer::resume(const std::string& checkpoint_dir) {
  State& s = *state_;
  restoreCheckpoint(s, checkpoint_dir);
  if (s.context->worker->rank() == 0)
    logInfo("resumed from ", checkpoint_dir, " at step ", s.next_step);
}

// Asynchronous checkpoints snapshot now and write on a background thread while training goes on.
bool writeCheckpointIfDue(Trainer::State& s, bool final_or_requested) {
  if (!s.checkpoints || s.last_checkpoint_step == s.next_step) return false;
  const CheckpointSection& section = s.context->job.checkpoint;
  const bool due = final_or_requested || (section.every > 0 && s.next_step % section.every == 0);
  if (!due) return false;
  finishPendingCheckpoint(s);
  CheckpointSnapshot snapshot = snapshotOf(s);
  const std::int64_t step = s.next_step;
  if (section.async && !final_or_requested) {
    s.last_checkpoint_step = step;
    // Shared: elastic recovery may replace the writer while this one still writes.
    std::shared_ptr<CheckpointWriter> writer = s.checkpoints;
    s.pending_checkpoint = std::async(std::launch::async, [writer, step, snapshot] {
      return writer->write(step, snapshot.files());
    });
    return true;
  }
  s.last_checkpoint_path = s.checkpoints->write(step, snapshot.files());
  s.last_checkpoint_step = step;  // after the write: one cut short by a lost rank is retried
  return true;
}

void finishPendingCheckpoint(Trainer::State& s) {
  if (s.pending_checkpoint.valid()) s.last_checkpoint_path = s.pending_checkpoint.get();
}

}  // namespace chorus::runtime
